//! Test-only crate: PyTorch as the oracle of shardproof.
//!
//! The fixtures are captured by `python/capture.py` (run through `scripts/oracle-capture`, which
//! writes them to `target/oracle`) and read by the tests under `tests/` when the environment
//! variable `SHARDPROOF_ORACLE_DIR` points at them:
//!
//! - `tests/ops_match_torch.rs`: every per-operator graph that torch.export printed must parse,
//!   the registry's shape and dtype inference must agree with every recorded type, and the
//!   reference interpreter must reproduce PyTorch's outputs (relative Frobenius error at most
//!   1e-6 for floats, exact for integers and booleans), over at least 60 distinct ATen operators.
//! - `tests/dist_fixtures.rs`: the captured distributed programs (single-device spec and per-rank
//!   graphs on the fake process-group backend) parse, infer, and name only process groups their
//!   case file maps; and the interpreter's lock-step run of each reproduces the losses that the
//!   capture simulated by hand, so each program's expected verdict holds numerically.
//!
//! Without `SHARDPROOF_ORACLE_DIR` the tests print why they skip and pass; with it set to a
//! directory that lacks the fixtures they fail. See `python/README.md`.
