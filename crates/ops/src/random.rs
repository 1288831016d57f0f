//! TODO(helper B): fill in.

use crate::Registry;

/// Registers this family.
pub(crate) fn register(_r: &mut Registry) {}
