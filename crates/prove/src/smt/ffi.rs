//! A minimal binding of the system libz3's C API: the few calls the prover makes.
//!
//! Why not the `z3` crate: its releases up to 0.12 generate their bindings with bindgen at
//! build time, which needs libclang (neither this machine nor CI has it), and the current ones
//! call C functions newer than the Z3 4.8.12 of Debian's libz3-dev (`Z3_mk_real_int64`: the
//! link fails). The C API below is stable since Z3 4.8 and links against the system `libz3`.
//!
//! The context is created with `Z3_mk_context` (not `_rc`): ASTs live until the context is
//! deleted, so they need no reference counting; solvers, models and parameter sets do.

#![allow(non_camel_case_types, unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

type Z3_config = *mut c_void;
type Z3_context = *mut c_void;
/// An AST handle, valid while its [`Z3`] lives.
pub type Ast = *mut c_void;
type Z3_sort = *mut c_void;
type Z3_symbol = *mut c_void;
type Z3_func_decl = *mut c_void;
type Z3_solver = *mut c_void;
type Z3_model = *mut c_void;
type Z3_params = *mut c_void;
type Z3_error_handler = extern "C" fn(Z3_context, c_uint);

#[link(name = "z3")]
extern "C" {
    fn Z3_mk_config() -> Z3_config;
    fn Z3_del_config(c: Z3_config);
    fn Z3_mk_context(c: Z3_config) -> Z3_context;
    fn Z3_del_context(c: Z3_context);
    fn Z3_set_error_handler(c: Z3_context, h: Option<Z3_error_handler>);
    fn Z3_get_error_code(c: Z3_context) -> c_uint;
    fn Z3_mk_string_symbol(c: Z3_context, s: *const c_char) -> Z3_symbol;
    fn Z3_mk_real_sort(c: Z3_context) -> Z3_sort;
    fn Z3_mk_int_sort(c: Z3_context) -> Z3_sort;
    fn Z3_mk_const(c: Z3_context, s: Z3_symbol, ty: Z3_sort) -> Ast;
    fn Z3_mk_numeral(c: Z3_context, numeral: *const c_char, ty: Z3_sort) -> Ast;
    fn Z3_mk_add(c: Z3_context, n: c_uint, args: *const Ast) -> Ast;
    fn Z3_mk_mul(c: Z3_context, n: c_uint, args: *const Ast) -> Ast;
    fn Z3_mk_div(c: Z3_context, a: Ast, b: Ast) -> Ast;
    fn Z3_mk_lt(c: Z3_context, a: Ast, b: Ast) -> Ast;
    fn Z3_mk_gt(c: Z3_context, a: Ast, b: Ast) -> Ast;
    fn Z3_mk_ge(c: Z3_context, a: Ast, b: Ast) -> Ast;
    fn Z3_mk_eq(c: Z3_context, a: Ast, b: Ast) -> Ast;
    fn Z3_mk_not(c: Z3_context, a: Ast) -> Ast;
    fn Z3_mk_and(c: Z3_context, n: c_uint, args: *const Ast) -> Ast;
    fn Z3_mk_or(c: Z3_context, n: c_uint, args: *const Ast) -> Ast;
    fn Z3_mk_implies(c: Z3_context, a: Ast, b: Ast) -> Ast;
    fn Z3_mk_ite(c: Z3_context, cond: Ast, a: Ast, b: Ast) -> Ast;
    fn Z3_mk_int2real(c: Z3_context, a: Ast) -> Ast;
    fn Z3_mk_func_decl(
        c: Z3_context,
        s: Z3_symbol,
        domain_size: c_uint,
        domain: *const Z3_sort,
        range: Z3_sort,
    ) -> Z3_func_decl;
    fn Z3_mk_app(c: Z3_context, d: Z3_func_decl, n: c_uint, args: *const Ast) -> Ast;
    fn Z3_mk_solver(c: Z3_context) -> Z3_solver;
    fn Z3_solver_inc_ref(c: Z3_context, s: Z3_solver);
    fn Z3_solver_dec_ref(c: Z3_context, s: Z3_solver);
    fn Z3_solver_assert(c: Z3_context, s: Z3_solver, a: Ast);
    fn Z3_solver_check(c: Z3_context, s: Z3_solver) -> c_int;
    fn Z3_solver_get_model(c: Z3_context, s: Z3_solver) -> Z3_model;
    fn Z3_solver_get_reason_unknown(c: Z3_context, s: Z3_solver) -> *const c_char;
    fn Z3_solver_set_params(c: Z3_context, s: Z3_solver, p: Z3_params);
    fn Z3_model_inc_ref(c: Z3_context, m: Z3_model);
    fn Z3_model_dec_ref(c: Z3_context, m: Z3_model);
    fn Z3_model_eval(c: Z3_context, m: Z3_model, t: Ast, completion: bool, v: *mut Ast) -> bool;
    fn Z3_is_numeral_ast(c: Z3_context, a: Ast) -> bool;
    fn Z3_get_numeral_string(c: Z3_context, a: Ast) -> *const c_char;
    fn Z3_mk_params(c: Z3_context) -> Z3_params;
    fn Z3_params_inc_ref(c: Z3_context, p: Z3_params);
    fn Z3_params_dec_ref(c: Z3_context, p: Z3_params);
    fn Z3_params_set_uint(c: Z3_context, p: Z3_params, k: Z3_symbol, v: c_uint);
}

/// Errors are read back with `Z3_get_error_code`; the default handler would exit the process.
extern "C" fn ignore_errors(_: Z3_context, _: c_uint) {}

/// The answer of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Satisfiable.
    Sat,
    /// Unsatisfiable.
    Unsat,
    /// Undecided.
    Unknown,
}

/// A Z3 context with one solver.
pub struct Z3 {
    ctx: Z3_context,
    solver: Z3_solver,
    real: Z3_sort,
    int: Z3_sort,
    timeout_ms: u32,
}

/// What a check found, read on the solver's own thread ([`Z3::check_apart`]).
pub struct Checked {
    /// The answer.
    pub answer: Answer,
    /// After sat: the model's values of the terms asked for ([`Z3::model_values`]).
    pub values: Vec<Option<String>>,
    /// After unknown: why ([`Z3::reason_unknown`]).
    pub reason: String,
}

/// The terms whose model values a check on another thread reads.
struct Terms(Vec<Ast>);

// SAFETY: a context is used by one thread at a time: `check_apart` moves it, with its ASTs,
// to the thread that checks and then drops it; the caller keeps no handle into it.
unsafe impl Send for Z3 {}
// SAFETY: as for `Z3`: the ASTs move with their context and are read only by its thread.
unsafe impl Send for Terms {}

// SAFETY notes for the calls below: every handle passed to libz3 was created by this context,
// which outlives them (dropped last, in `Drop`); strings are NUL-terminated CStrings that live
// across the call.
impl Z3 {
    /// A fresh context and solver with the given time limit (milliseconds).
    pub fn new(timeout_ms: u32) -> Z3 {
        unsafe {
            let cfg = Z3_mk_config();
            let ctx = Z3_mk_context(cfg);
            Z3_del_config(cfg);
            Z3_set_error_handler(ctx, Some(ignore_errors));
            let solver = Z3_mk_solver(ctx);
            Z3_solver_inc_ref(ctx, solver);
            let params = Z3_mk_params(ctx);
            Z3_params_inc_ref(ctx, params);
            let key = CString::new("timeout").expect("no NUL");
            let sym = Z3_mk_string_symbol(ctx, key.as_ptr());
            Z3_params_set_uint(ctx, params, sym, timeout_ms);
            Z3_solver_set_params(ctx, solver, params);
            Z3_params_dec_ref(ctx, params);
            let real = Z3_mk_real_sort(ctx);
            let int = Z3_mk_int_sort(ctx);
            Z3 {
                ctx,
                solver,
                real,
                int,
                timeout_ms,
            }
        }
    }

    /// The error code of the last call (0: none).
    pub fn error(&self) -> u32 {
        unsafe { Z3_get_error_code(self.ctx) }
    }

    fn symbol(&self, name: &str) -> Z3_symbol {
        let s = CString::new(name.replace('\0', "_")).expect("no NUL");
        unsafe { Z3_mk_string_symbol(self.ctx, s.as_ptr()) }
    }

    /// A real constant named `name`.
    pub fn real_const(&self, name: &str) -> Ast {
        unsafe { Z3_mk_const(self.ctx, self.symbol(name), self.real) }
    }

    /// An integer constant named `name`, as a real.
    pub fn int_const_as_real(&self, name: &str) -> Ast {
        unsafe { Z3_mk_int2real(self.ctx, Z3_mk_const(self.ctx, self.symbol(name), self.int)) }
    }

    /// The real numeral `text` (`3`, `-1/2`).
    pub fn numeral(&self, text: &str) -> Ast {
        let s = CString::new(text).expect("no NUL");
        unsafe { Z3_mk_numeral(self.ctx, s.as_ptr(), self.real) }
    }

    /// The sum of `xs` (at least one).
    pub fn add(&self, xs: &[Ast]) -> Ast {
        unsafe { Z3_mk_add(self.ctx, xs.len() as c_uint, xs.as_ptr()) }
    }

    /// The product of `xs` (at least one).
    pub fn mul(&self, xs: &[Ast]) -> Ast {
        unsafe { Z3_mk_mul(self.ctx, xs.len() as c_uint, xs.as_ptr()) }
    }

    /// a / b.
    pub fn div(&self, a: Ast, b: Ast) -> Ast {
        unsafe { Z3_mk_div(self.ctx, a, b) }
    }

    /// a < b.
    pub fn lt(&self, a: Ast, b: Ast) -> Ast {
        unsafe { Z3_mk_lt(self.ctx, a, b) }
    }

    /// a > b.
    pub fn gt(&self, a: Ast, b: Ast) -> Ast {
        unsafe { Z3_mk_gt(self.ctx, a, b) }
    }

    /// a >= b.
    pub fn ge(&self, a: Ast, b: Ast) -> Ast {
        unsafe { Z3_mk_ge(self.ctx, a, b) }
    }

    /// a == b.
    pub fn eq(&self, a: Ast, b: Ast) -> Ast {
        unsafe { Z3_mk_eq(self.ctx, a, b) }
    }

    /// not a.
    pub fn not(&self, a: Ast) -> Ast {
        unsafe { Z3_mk_not(self.ctx, a) }
    }

    /// The conjunction of `xs`.
    pub fn and(&self, xs: &[Ast]) -> Ast {
        unsafe { Z3_mk_and(self.ctx, xs.len() as c_uint, xs.as_ptr()) }
    }

    /// The disjunction of `xs`.
    pub fn or(&self, xs: &[Ast]) -> Ast {
        unsafe { Z3_mk_or(self.ctx, xs.len() as c_uint, xs.as_ptr()) }
    }

    /// a implies b.
    pub fn implies(&self, a: Ast, b: Ast) -> Ast {
        unsafe { Z3_mk_implies(self.ctx, a, b) }
    }

    /// if c then a else b.
    pub fn ite(&self, c: Ast, a: Ast, b: Ast) -> Ast {
        unsafe { Z3_mk_ite(self.ctx, c, a, b) }
    }

    /// The uninterpreted real function `name` of `args.len()` real arguments, applied.
    pub fn apply_uninterpreted(&self, name: &str, args: &[Ast]) -> Ast {
        let domain = vec![self.real; args.len()];
        unsafe {
            let decl = Z3_mk_func_decl(
                self.ctx,
                self.symbol(name),
                domain.len() as c_uint,
                domain.as_ptr(),
                self.real,
            );
            Z3_mk_app(self.ctx, decl, args.len() as c_uint, args.as_ptr())
        }
    }

    /// Asserts `a`.
    pub fn assert(&self, a: Ast) {
        unsafe { Z3_solver_assert(self.ctx, self.solver, a) }
    }

    /// Checks the assertions.
    pub fn check(&self) -> Answer {
        match unsafe { Z3_solver_check(self.ctx, self.solver) } {
            1 => Answer::Sat,
            -1 => Answer::Unsat,
            _ => Answer::Unknown,
        }
    }

    /// Checks on a thread of its own and waits at most the time limit and `grace`: Z3 does not
    /// always honour its `timeout` (a non-linear goal of 304 terms ran for minutes past 10 s in
    /// Z3 4.8.12, its cancel flag unread, so `Z3_interrupt` does not stop it either). Past the
    /// wait, `None`: the goal is unknown, and the thread is left to finish and free the
    /// context on its own (it holds nothing of the caller's).
    pub fn check_apart(self, grace: std::time::Duration, terms: Vec<Ast>) -> Option<Checked> {
        let limit = std::time::Duration::from_millis(u64::from(self.timeout_ms)) + grace;
        let terms = Terms(terms);
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let terms = terms;
            let answer = self.check();
            let checked = Checked {
                answer,
                values: match answer {
                    Answer::Sat => self.model_values(&terms.0),
                    _ => Vec::new(),
                },
                reason: match answer {
                    Answer::Unknown => self.reason_unknown(),
                    _ => String::new(),
                },
            };
            // The caller may have stopped waiting: nothing to tell it then.
            let _ = send.send(checked);
        });
        receive.recv_timeout(limit).ok()
    }

    /// Why the last check was unknown.
    pub fn reason_unknown(&self) -> String {
        unsafe {
            let p = Z3_solver_get_reason_unknown(self.ctx, self.solver);
            if p.is_null() {
                "unknown".into()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    /// After a sat check: the model's values of `terms` as rational numerals (`3`, `-1/2`);
    /// `None` for a value that is not a rational numeral (an algebraic number).
    pub fn model_values(&self, terms: &[Ast]) -> Vec<Option<String>> {
        unsafe {
            let model = Z3_solver_get_model(self.ctx, self.solver);
            if model.is_null() {
                return vec![None; terms.len()];
            }
            Z3_model_inc_ref(self.ctx, model);
            let out = terms
                .iter()
                .map(|&t| {
                    let mut v: Ast = std::ptr::null_mut();
                    if !Z3_model_eval(self.ctx, model, t, true, &mut v)
                        || v.is_null()
                        || !Z3_is_numeral_ast(self.ctx, v)
                    {
                        return None;
                    }
                    let s = Z3_get_numeral_string(self.ctx, v);
                    (!s.is_null()).then(|| CStr::from_ptr(s).to_string_lossy().into_owned())
                })
                .collect();
            Z3_model_dec_ref(self.ctx, model);
            out
        }
    }
}

impl Drop for Z3 {
    fn drop(&mut self) {
        unsafe {
            Z3_solver_dec_ref(self.ctx, self.solver);
            Z3_del_context(self.ctx);
        }
    }
}
