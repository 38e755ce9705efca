//! What a zkgate server process shares, whatever it serves (reconcilers,
//! admission or both): its metrics, its health, and the backoff its loops
//! retry with. Stands on the API types and the recipes only.

pub mod backoff;
pub mod health;
pub mod metrics;
