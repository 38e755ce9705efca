//! The order between runs' Barriers (`spec.after`, the annotation
//! `zkgate.io/after`): following the `after`s from a Barrier, as the API
//! server has them now, for a cycle. Admission refuses what would make one;
//! the controller fails the Barriers on one.

use std::collections::{BTreeSet, HashMap};

use kube::api::Api;
use kube::ResourceExt;

use crate::api::Barrier;

/// The most Barriers read when looking for a cycle of `after`s (one look
/// costs at most this many reads, whatever a tenant makes).
pub const MAX_VISITS: usize = 64;

/// The chain `a → b → ... → a` if following `after`s from `barrier` comes
/// back to it (names only, as the API server has them now; those read are
/// kept in `read`).
pub async fn cycle_of(
    api: &Api<Barrier>,
    barrier: &Barrier,
    read: &mut HashMap<String, Option<Barrier>>,
) -> Result<Chain, kube::Error> {
    let first = barrier
        .spec
        .after
        .iter()
        .map(|a| a.barrier.clone())
        .collect();
    cycle_from(api, &barrier.name_any(), first, read).await
}

/// What following `after`s from a Barrier finds.
#[derive(Debug, PartialEq, Eq)]
pub enum Chain {
    /// No cycle.
    Fine,
    /// A cycle back to it: `a → b → a`.
    Cycle(String),
    /// More than [`MAX_VISITS`] Barriers on the way: not followed further.
    TooLong,
}

impl Chain {
    /// Why admission refuses what gave these `after`s, if it does: the end
    /// of a sentence whose subject is what asked for them.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Chain::Fine => None,
            Chain::Cycle(chain) => Some(format!(
                "makes a cycle: {chain} (each would wait for the other for ever)"
            )),
            Chain::TooLong => Some(format!(
                "reaches more than {MAX_VISITS} Barriers, too many to check for a cycle"
            )),
        }
    }
}

/// The chain `start → ... → start` if following `first` (the Barriers
/// `start` would start after), then the `after`s of the Barriers there
/// now, comes back to `start`. At most [`MAX_VISITS`] Barriers are read
/// (each once, kept in `read`, `None` for one not there): past them,
/// [`Chain::TooLong`].
pub async fn cycle_from(
    api: &Api<Barrier>,
    start: &str,
    first: Vec<String>,
    read: &mut HashMap<String, Option<Barrier>>,
) -> Result<Chain, kube::Error> {
    let start = start.to_owned();
    // Depth-first, keeping the path.
    let mut seen = BTreeSet::new();
    let mut stack: Vec<(Vec<String>, Vec<String>)> = vec![(vec![start.clone()], first)];
    while let Some((path, mut next)) = stack.pop() {
        let Some(name) = next.pop() else { continue };
        stack.push((path.clone(), next));
        if name == start {
            let mut chain = path.clone();
            chain.push(name);
            return Ok(Chain::Cycle(chain.join(" → ")));
        }
        if seen.contains(&name) {
            continue;
        }
        if seen.len() >= MAX_VISITS {
            return Ok(Chain::TooLong);
        }
        seen.insert(name.clone());
        let found = api.get_opt(&name).await?;
        if let Some(found) = &found {
            let mut deeper = path.clone();
            deeper.push(name.clone());
            stack.push((
                deeper,
                found.spec.after.iter().map(|a| a.barrier.clone()).collect(),
            ));
        }
        read.insert(name, found);
    }
    Ok(Chain::Fine)
}
