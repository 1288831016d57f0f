//! Helpers of the integration tests.
pub mod plans;
pub mod values;
