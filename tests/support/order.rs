//! ZooKeeper's own order of writes, for checks that must not rest on
//! zkgate's markers or on what is listed after the fact.
//!
//! A barrier opened with all its participants when its `ready` node was
//! created after every registration it counted: each registration's czxid
//! (the zxid of the write that made it, ZooKeeper's total order) is below
//! `ready`'s. A listing taken once everyone passed cannot tell a
//! registration made before the opening from one made after it; the czxids
//! can.

use zkgate::zk::Session;

/// The czxid of `ready` under `barrier` and of each registration `ids`
/// under it, or why not (a node missing). The registrations must still be
/// there: call it before any participant leaves.
pub async fn czxids(
    session: &Session,
    barrier: &str,
    ids: &[String],
) -> Result<(i64, Vec<(String, i64)>), String> {
    // A read that fails (a leader killed by the soak) is asked again once
    // the session has reconnected, for up to a minute.
    let stat = |path: String| async move {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            match session.client().check_stat(&path).await {
                Ok(Some(stat)) => return Ok(stat.czxid),
                Ok(None) => return Err(format!("{path} does not exist")),
                // Whatever a killed server's connection ends with (a lost
                // connection, a timeout, a reset: the soak's CI run met
                // 'Connection reset by peer'), asked again meanwhile.
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => return Err(format!("{path}: {e}")),
            }
        }
    };
    let ready = stat(format!("{barrier}/ready")).await?;
    let mut registrations = Vec::with_capacity(ids.len());
    for id in ids {
        registrations.push((id.clone(), stat(format!("{barrier}/{id}")).await?));
    }
    Ok((ready, registrations))
}

/// Whether, by these czxids, `ready` was made after every registration;
/// else the registrations made at or after it.
pub fn opened_after_all(ready: i64, registrations: &[(String, i64)]) -> Result<(), String> {
    let late: Vec<_> = registrations
        .iter()
        .filter(|(_, czxid)| *czxid >= ready)
        .collect();
    if late.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "ready (czxid {ready:#x}) was made before the registrations {late:x?}: \
             the barrier opened without them"
        ))
    }
}

/// Asserts that `barrier` opened only with all of `ids` registered: its
/// `ready` node's czxid is after the largest of theirs. `ids` must be the
/// barrier's whole set of participants (x of them) and still registered.
pub async fn assert_opened_after_all(session: &Session, barrier: &str, ids: &[String]) {
    let (ready, registrations) = czxids(session, barrier, ids)
        .await
        .unwrap_or_else(|e| panic!("{barrier}: {e}"));
    if let Err(e) = opened_after_all(ready, &registrations) {
        panic!("{barrier}: {e}");
    }
}
