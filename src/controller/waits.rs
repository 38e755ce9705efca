//! Which Barriers wait on which (`spec.after`), so that the reconcile of a
//! named Barrier can ask for a look at those waiting on it. Apart from
//! [`super::after`], which judges a wait and needs the reconcile's
//! context, which holds this.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc::UnboundedSender;

use crate::api::Barrier;

/// Which Barriers wait on which: the reconcile of a named Barrier asks for
/// a look at those waiting on it.
pub struct Waits {
    maps: Mutex<WaitMaps>,
    look: UnboundedSender<ObjectRef<Barrier>>,
}

/// (namespace, name) → the Barriers of that namespace waiting on it, and
/// the other way round (so that a change costs what it changes).
#[derive(Default)]
struct WaitMaps {
    on: HashMap<(String, String), BTreeSet<String>>,
    of: HashMap<(String, String), Vec<String>>,
}

impl Waits {
    /// `look` asks the Barrier controller for a reconcile.
    pub fn new(look: UnboundedSender<ObjectRef<Barrier>>) -> Self {
        Waits {
            maps: Mutex::default(),
            look,
        }
    }

    /// `dependent` (in `namespace`) waits on `named` now, and on nothing
    /// else (empty: it waits no more).
    pub fn set(&self, namespace: &str, dependent: &str, named: &[String]) {
        let key = (namespace.to_owned(), dependent.to_owned());
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if maps
            .of
            .get(&key)
            .map_or(named.is_empty(), |was| was[..] == *named)
        {
            return;
        }
        for was in maps.of.remove(&key).unwrap_or_default() {
            let on = (namespace.to_owned(), was);
            if let Some(dependents) = maps.on.get_mut(&on) {
                dependents.remove(dependent);
                if dependents.is_empty() {
                    maps.on.remove(&on);
                }
            }
        }
        if named.is_empty() {
            return;
        }
        for name in named {
            maps.on
                .entry((namespace.to_owned(), name.clone()))
                .or_default()
                .insert(dependent.to_owned());
        }
        maps.of.insert(key, named.to_vec());
    }

    /// The Barriers waiting on `named`.
    pub fn dependents(&self, namespace: &str, named: &str) -> Vec<ObjectRef<Barrier>> {
        let maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        maps.on
            .get(&(namespace.to_owned(), named.to_owned()))
            .into_iter()
            .flatten()
            .map(|dependent| ObjectRef::new(dependent).within(namespace))
            .collect()
    }

    /// Asks for a look at the Barriers waiting on `named`.
    pub fn touch(&self, namespace: &str, named: &str) {
        for dependent in self.dependents(namespace, named) {
            let _ = self.look.send(dependent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_follow_what_each_barrier_names_now() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let waits = Waits::new(tx);
        let looked = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Barrier>>| {
            let mut names = Vec::new();
            while let Ok(r) = rx.try_recv() {
                names.push(r.name);
            }
            names.sort();
            names
        };
        waits.set("ns", "launcher", &["workers".into(), "db".into()]);
        waits.set("ns", "other", &["workers".into()]);
        waits.touch("ns", "workers");
        assert_eq!(looked(&mut rx), ["launcher", "other"]);
        waits.touch("elsewhere", "workers");
        assert!(looked(&mut rx).is_empty());
        waits.set("ns", "launcher", &["db".into()]);
        waits.touch("ns", "workers");
        assert_eq!(looked(&mut rx), ["other"]);
        waits.set("ns", "other", &[]);
        waits.touch("ns", "workers");
        assert!(looked(&mut rx).is_empty());
        waits.touch("ns", "db");
        assert_eq!(looked(&mut rx), ["launcher"]);
    }
}
