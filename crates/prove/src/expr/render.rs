//! Readable renderings of expressions for reports.

use super::{Arena, Atom, Coeff, ExprId};

impl Arena {
    /// A readable rendering of `e` (for reports; long expressions are cut).
    pub fn render(&self, e: ExprId, max_len: usize) -> String {
        let mut out = String::new();
        self.render_into(e, &mut out, max_len);
        if out.len() > max_len {
            let mut cut = max_len;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
            out.push_str(" ...");
        }
        out
    }

    fn render_into(&self, e: ExprId, out: &mut String, max_len: usize) {
        let p = self.poly(e);
        if p.terms.is_empty() {
            out.push('0');
            return;
        }
        for (i, (m, c)) in p.terms.iter().enumerate() {
            if out.len() > max_len {
                return;
            }
            let neg = c.is_negative();
            if i > 0 {
                out.push_str(if neg { " - " } else { " + " });
            } else if neg {
                out.push('-');
            }
            let c = c.abs();
            if m.is_empty() || !c.is_one() {
                out.push_str(&render_rat(&c));
                if !m.is_empty() {
                    out.push('*');
                }
            }
            for (j, &(a, k)) in m.iter().enumerate() {
                if j > 0 {
                    out.push('*');
                }
                match self.atom(a) {
                    Atom::Symbol(s) => out.push_str(self.symbol_name(*s)),
                    Atom::NonFinite(1) => out.push_str("inf"),
                    Atom::NonFinite(-1) => out.push_str("(-inf)"),
                    Atom::NonFinite(_) => out.push_str("nan"),
                    Atom::App(f, args) => {
                        out.push_str(&f.name());
                        out.push('(');
                        for (n, &x) in args.iter().enumerate() {
                            if n > 0 {
                                out.push_str(", ");
                            }
                            self.render_into(x, out, max_len);
                        }
                        out.push(')');
                    }
                }
                if k > 1 {
                    out.push_str(&format!("^{k}"));
                }
            }
        }
    }
}

fn render_rat(r: &Coeff) -> String {
    if r.is_integer() {
        return r.to_string();
    }
    // Dyadic rationals from f64 literals read better as decimals.
    let f = r.to_f64();
    if Coeff::from_float(f).as_ref() == Some(r) {
        format!("{f}")
    } else {
        format!("({r})")
    }
}
