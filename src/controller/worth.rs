//! Which of a resource's own changes are worth a reconcile.
//!
//! A resource changes far more often than it needs a reconcile: the
//! controller's own status writes and the finalizer it adds come back as
//! changes too. Reconciling on those made every new resource cost three
//! reconciles (the finalizer, the znodes and status, a look that found
//! nothing left to write): a third of the cold first sync at 10,000
//! resources. So a resource's own change triggers a reconcile when it is new
//! to the controller, or its generation (its spec, or its deletion), its
//! annotations (a credential rotation asked for) or its labels changed, or
//! the controller's finalizer went (someone removed it: it is put back at
//! once, not at the next periodic look), or its status changed to one the
//! controller did not write last (someone else's write is corrected at
//! once; and an older write of its own, arriving after a reconcile that
//! read an even older status from a lagging watch and so wrote nothing,
//! gets that reconcile's status written). The reflector's store still holds
//! every version, so a reconcile always reads the latest.
//!
//! kube's `predicate_filter` cannot tell the last case (its predicates see
//! one version at a time: "has the finalizer" would fire on the
//! controller's own adding of it too), hence this small stateful filter.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::collections::{HashMap, HashSet};
use std::fmt::{self, Debug, Write as _};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::OnceLock;

use kube::core::object::HasStatus;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::api::FINALIZER;

/// What of one resource's last version decides whether the next is worth a
/// reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    generation: Option<i64>,
    /// A hash of the annotations and labels.
    metadata: u64,
    finalized: bool,
    /// A digest of the status (see [`digest`]).
    status: u64,
}

impl Seen {
    fn of<K: Resource + HasStatus<Status: Debug>>(object: &K) -> Seen {
        let mut hasher = DefaultHasher::new();
        object.annotations().hash(&mut hasher);
        object.labels().hash(&mut hasher);
        let metadata = hasher.finish();
        Seen {
            generation: object.meta().generation,
            metadata,
            finalized: object.finalizers().iter().any(|f| f == FINALIZER),
            status: digest(object.status()),
        }
    }
}

/// A digest of a status, stable within the process: of its `Debug` form,
/// which keeps what its JSON drops (a time's fraction of a second: a
/// status someone wrote that differs from the controller's only there is
/// still someone else's), and prints equal statuses alike (the status types
/// hold no maps). Keyed at random once per process, so that nobody can
/// work out a status that collides with one the controller writes.
pub fn digest<S: Debug>(status: Option<&S>) -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    let mut hasher = KEYS.get_or_init(RandomState::new).build_hasher();
    // Writing into a hasher cannot fail.
    let _ = write!(Hashing(&mut hasher), "{status:?}");
    hasher.finish()
}

/// Feeds what is formatted into a hasher, without a string in between.
struct Hashing<'a, H>(&'a mut H);

impl<H: Hasher> fmt::Write for Hashing<'_, H> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

/// The filter: the watch's events in, the objects worth a reconcile out.
/// Remembers one small entry per live resource (by uid); a deletion, or a
/// relist that no longer holds it, forgets it.
#[derive(Debug, Default)]
pub struct Worth {
    seen: HashMap<String, Seen>,
    /// The uids a relist in progress has seen.
    relisted: Option<HashSet<String>>,
}

impl Worth {
    /// The object of `event` if it is worth a reconcile; `own` tells
    /// whether an object's status is the last one the controller wrote.
    pub fn event<K: Resource + HasStatus<Status: Debug>>(
        &mut self,
        event: watcher::Event<K>,
        own: impl Fn(&K) -> bool,
    ) -> Option<K> {
        match event {
            watcher::Event::Init => {
                self.relisted = Some(HashSet::new());
                None
            }
            watcher::Event::InitApply(object) => {
                if let (Some(relisted), Some(uid)) = (self.relisted.as_mut(), object.uid()) {
                    relisted.insert(uid);
                }
                self.worth(object, own)
            }
            watcher::Event::InitDone => {
                // Deleted while the watch was down: no deletion event came.
                if let Some(relisted) = self.relisted.take() {
                    self.seen.retain(|uid, _| relisted.contains(uid));
                }
                None
            }
            watcher::Event::Apply(object) => self.worth(object, own),
            watcher::Event::Delete(object) => {
                if let Some(uid) = object.uid() {
                    self.seen.remove(&uid);
                }
                None
            }
        }
    }

    fn worth<K: Resource + HasStatus<Status: Debug>>(
        &mut self,
        object: K,
        own: impl Fn(&K) -> bool,
    ) -> Option<K> {
        let Some(uid) = object.uid() else {
            return Some(object);
        };
        let now = Seen::of(&object);
        match self.seen.insert(uid, now) {
            None => Some(object),
            Some(before) => (before.generation != now.generation
                || before.metadata != now.metadata
                || (before.finalized && !now.finalized)
                || (before.status != now.status && !own(&object)))
            .then_some(object),
        }
    }

    /// How many resources it remembers.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Barrier, BarrierPhase};
    use watcher::Event;

    fn barrier(uid: &str, generation: i64) -> Barrier {
        let mut b = Barrier::new("b", Default::default());
        b.metadata.uid = Some(uid.into());
        b.metadata.generation = Some(generation);
        b
    }

    /// An event, every status in it the controller's own.
    fn ev(worth: &mut Worth, event: Event<Barrier>) -> Option<Barrier> {
        worth.event(event, |_| true)
    }

    fn finalized(mut b: Barrier) -> Barrier {
        b.metadata.finalizers = Some(vec![FINALIZER.into()]);
        b
    }

    #[test]
    fn a_new_resource_and_its_spec_changes_are_worth_a_reconcile_its_own_writes_are_not() {
        let mut worth = Worth::default();
        assert!(
            ev(&mut worth, Event::Apply(barrier("u", 1))).is_some(),
            "new"
        );
        assert!(
            ev(&mut worth, Event::Apply(finalized(barrier("u", 1)))).is_none(),
            "the controller's finalizer"
        );
        let mut with_status = finalized(barrier("u", 1));
        with_status.status = Some(Default::default());
        assert!(
            ev(&mut worth, Event::Apply(with_status)).is_none(),
            "the controller's status"
        );
        assert!(
            ev(&mut worth, Event::Apply(finalized(barrier("u", 2)))).is_some(),
            "a spec change, or the deletion"
        );
    }

    #[test]
    fn annotations_labels_and_a_removed_finalizer_are_worth_a_reconcile() {
        let mut worth = Worth::default();
        ev(&mut worth, Event::Apply(finalized(barrier("u", 1))));
        let mut annotated = finalized(barrier("u", 1));
        annotated
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("zkgate.io/rotate-credential".into(), "1".into());
        assert!(ev(&mut worth, Event::Apply(annotated.clone())).is_some());
        let mut labelled = annotated.clone();
        labelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "a".into());
        assert!(ev(&mut worth, Event::Apply(labelled.clone())).is_some());
        labelled.metadata.finalizers = None;
        assert!(
            ev(&mut worth, Event::Apply(labelled)).is_some(),
            "the finalizer removed by someone: put back at once"
        );
    }

    #[test]
    fn a_deleted_resource_is_forgotten_and_one_of_the_same_name_is_new() {
        let mut worth = Worth::default();
        ev(&mut worth, Event::Apply(finalized(barrier("u1", 1))));
        ev(&mut worth, Event::Delete(finalized(barrier("u1", 2))));
        assert_eq!(worth.remembered(), 0);
        assert!(
            ev(&mut worth, Event::Apply(barrier("u2", 1))).is_some(),
            "made again under the same name"
        );
    }

    #[test]
    fn a_relist_forgets_what_was_deleted_while_the_watch_was_down() {
        let mut worth = Worth::default();
        ev(&mut worth, Event::Apply(finalized(barrier("gone", 1))));
        ev(&mut worth, Event::Apply(finalized(barrier("kept", 1))));
        assert!(ev(&mut worth, Event::<Barrier>::Init).is_none());
        assert!(
            ev(&mut worth, Event::InitApply(finalized(barrier("kept", 1)))).is_none(),
            "unchanged while the watch was down"
        );
        assert!(ev(&mut worth, Event::<Barrier>::InitDone).is_none());
        assert_eq!(worth.remembered(), 1);
    }

    #[test]
    fn a_status_someone_else_wrote_is_worth_a_reconcile_the_controllers_own_is_not() {
        let mut worth = Worth::default();
        ev(&mut worth, Event::Apply(finalized(barrier("u", 1))));
        let mut forged = finalized(barrier("u", 1));
        forged.status = Some(crate::api::BarrierStatus {
            phase: Some(BarrierPhase::Completed),
            ..Default::default()
        });
        assert!(
            worth
                .event(Event::Apply(forged.clone()), |_| true)
                .is_none(),
            "the controller's own write"
        );
        forged.status.as_mut().unwrap().entered = 3;
        assert!(
            worth.event(Event::Apply(forged), |_| false).is_some(),
            "not the status the controller wrote last: corrected at once"
        );
    }
}
