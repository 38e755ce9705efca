//! Whatever bytes a barrier, participant or lock node holds, and whatever a
//! child is named, the parsers return a value or an error: no panic, and
//! what parses serializes back to something that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zkgate::zk::LockNodeData;
use zkgate::zk::contender::{self, Contender};
use zkgate::zk::{BarrierData, ParticipantData};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(barrier)) = BarrierData::parse("/b", data) {
        let again = BarrierData::parse("/b", &barrier.to_bytes());
        assert_eq!(again.ok().flatten(), Some(barrier));
    }
    let participant = ParticipantData::parse(data);
    let bytes = serde_json::to_vec(&participant).expect("serializable");
    assert_eq!(ParticipantData::parse(&bytes), participant);
    if let Ok(lock) = serde_json::from_slice::<LockNodeData>(data) {
        let bytes = serde_json::to_vec(&lock).expect("serializable");
        let again: LockNodeData = serde_json::from_slice(&bytes).expect("round trip");
        assert_eq!(again.uid, lock.uid);
    }
    if let Ok(name) = std::str::from_utf8(data) {
        if let Some(contender) = Contender::parse(name) {
            assert_eq!(contender.name, name);
            // Ordering it among others never panics, and a foreign name
            // never enters the queue.
            let children = [name.to_owned(), "lock-0000000001".into(), "junk".into()];
            let queue = contender::queue(&children);
            assert_eq!(queue.len(), 2);
            assert!(queue.iter().any(|c| c.name == name));
        }
    }
});
