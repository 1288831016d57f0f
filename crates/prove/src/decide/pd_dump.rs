//! Throwaway: where two normal forms part (not committed).
#![allow(missing_docs, dead_code)]
use crate::expr::{add_term, Arena, Atom, AtomId, Coeff, ExprId, Mono};
use std::collections::{BTreeMap, BTreeSet};

fn atom_str(ar: &Arena, a: AtomId) -> String {
    match ar.atom(a) {
        Atom::Symbol(s) => ar.symbol_name(*s).to_string(),
        Atom::NonFinite(k) => format!("nf{k}"),
        Atom::App(f, args) => {
            let parts: Vec<String> = args
                .iter()
                .map(|x| format!("e{}[{}t]", x.0, ar.poly(*x).terms.len()))
                .collect();
            format!("a{}:{}({})", a.0, f.name(), parts.join(","))
        }
    }
}

fn mono_str(ar: &Arena, m: &Mono) -> String {
    m.iter()
        .map(|&(a, e)| if e > 1 { format!("{}^{e}", atom_str(ar, a)) } else { atom_str(ar, a) })
        .collect::<Vec<_>>()
        .join(" * ")
}

pub(crate) fn dump(ar: &Arena, a: ExprId, b: ExprId, depth: usize, seen: &mut BTreeSet<(ExprId, ExprId)>) {
    if depth > 12 || !seen.insert((a, b)) || seen.len() > 60 {
        return;
    }
    let pad = "  ".repeat(depth);
    let mut diff: BTreeMap<Mono, Coeff> = BTreeMap::new();
    for (m, c) in &ar.poly(a).terms {
        add_term(&mut diff, m.clone(), c.clone());
    }
    for (m, c) in &ar.poly(b).terms {
        add_term(&mut diff, m.clone(), -c);
    }
    eprintln!(
        "{pad}PART e{} ({}t) vs e{} ({}t): diff {} terms",
        a.0,
        ar.poly(a).terms.len(),
        b.0,
        ar.poly(b).terms.len(),
        diff.len()
    );
    for (m, c) in diff.iter().take(40) {
        eprintln!("{pad}  {c} * {}", mono_str(ar, m));
    }
    // Atoms only in a's terms / only in b's.
    let atoms = |e: ExprId| -> BTreeSet<AtomId> {
        ar.poly(e).terms.iter().flat_map(|(m, _)| m.iter().map(|&(x, _)| x)).collect()
    };
    let (sa, sb) = (atoms(a), atoms(b));
    let only_a: Vec<AtomId> = sa.difference(&sb).copied().collect();
    let only_b: Vec<AtomId> = sb.difference(&sa).copied().collect();
    eprintln!("{pad}  only-spec atoms {} only-impl atoms {}", only_a.len(), only_b.len());
    // Pair atoms with the same function and arity, sharing most arguments.
    for &x in only_a.iter().take(6) {
        let Atom::App(fx, ax) = ar.atom(x) else { continue };
        let mut best: Option<(usize, AtomId)> = None;
        for &y in &only_b {
            let Atom::App(fy, ay) = ar.atom(y) else { continue };
            if fx != fy || ax.len() != ay.len() {
                continue;
            }
            let same = ax.iter().zip(ay).filter(|(p, q)| p == q).count();
            if best.is_none_or(|(s, _)| same > s) {
                best = Some((same, y));
            }
        }
        if let Some((_, y)) = best {
            let Atom::App(_, ay) = ar.atom(y) else { continue };
            eprintln!("{pad}  pair {} ~ {}", atom_str(ar, x), atom_str(ar, y));
            for (p, q) in ax.clone().iter().zip(ay.clone().iter()) {
                if p != q {
                    dump(ar, *p, *q, depth + 1, seen);
                }
            }
        }
    }
}

pub(crate) fn short_atom(ar: &Arena, a: AtomId) -> String {
    match ar.atom(a) {
        Atom::Symbol(s) => ar.symbol_name(*s).to_string(),
        Atom::NonFinite(k) => format!("nf{k}"),
        Atom::App(crate::expr::Func::Lookup, args) => format!("a{}:lookup(e{};{})", a.0, args[0].0, args.len() - 1),
        Atom::App(f, args) => {
            let parts: Vec<String> = args
                .iter()
                .map(|x| {
                    let p = ar.poly(*x);
                    if p.terms.len() == 1 && p.terms[0].0.len() == 1 && p.terms[0].1.is_one() {
                        short_atom(ar, p.terms[0].0[0].0)
                    } else {
                        format!("e{}[{}t]", x.0, p.terms.len())
                    }
                })
                .collect();
            format!("a{}:{}({})", a.0, f.name(), parts.join(","))
        }
    }
}

pub(crate) fn dump_terms(ar: &Arena, label: &str, t: &BTreeMap<Mono, Coeff>, n: usize) {
    eprintln!("PDDUMP {label}: {} terms", t.len());
    for (m, c) in t.iter().take(n) {
        let s = m
            .iter()
            .map(|&(a, e)| if e > 1 { format!("{}^{e}", short_atom(ar, a)) } else { short_atom(ar, a) })
            .collect::<Vec<_>>()
            .join(" * ");
        eprintln!("PDDUMP   {c} * {s}");
    }
}
