//! Helpers of the integration tests.
pub mod chunks;
pub mod dispatch;
pub mod folded;
pub mod hand;
pub mod plans;
pub mod ring_backward;
pub mod values;
