//! Helpers of the integration tests.
pub mod hand;
pub mod plans;
pub mod values;
