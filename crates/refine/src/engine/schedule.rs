//! Running the walk's spec operators on worker threads (rayon) with the result of a run on one
//! thread, byte for byte: each operator reads the relations as they stand just before it in
//! node order, and the results are committed in node order.
//!
//! An operator reads the relations of a few spec values ([`NodePlan::reads`]: its inputs, its
//! seeded equations' values). Those are written by their producers and by later views carried
//! back onto them (`view_back`), all in node order. So an operator may start once every writer
//! of what it reads that comes before it has been committed: its snapshot of those relations
//! is then the one a single thread would have given it. Results wait for the ones before them
//! and are committed in order; the walk's early stop (a settled verdict) is taken at the same
//! operator as on one thread, and work started past it is dropped.

use super::{views_back, Grown, NodePlan, NodeResult, State, Walk};
use shardproof_ir::ValueId;
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;

/// How many operators past the oldest uncommitted one may be in flight or waiting: bounds the
/// results held and the work wasted when the walk stops early.
const WINDOW: usize = 64;

/// Infers the operators `order` (with their `plans`) and commits each result with `commit`,
/// in order; the first error `commit` returns ends the walk.
pub(super) fn run<E>(
    walk: &Walk,
    order: &[usize],
    plans: &[NodePlan],
    grown: &mut Grown,
    mut commit: impl FnMut(&mut Grown, usize, NodeResult) -> Result<(), E>,
) -> Result<(), E> {
    let jobs = walk
        .opts
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let snapshot = |grown: &Grown, i: usize| -> (HashMap<ValueId, State>, HashSet<ValueId>) {
        let reads = &plans[i].reads;
        (
            reads
                .iter()
                .filter_map(|x| grown.state.get(x).map(|s| (*x, s.clone())))
                .collect(),
            reads
                .iter()
                .filter(|x| grown.refuted.contains(x))
                .copied()
                .collect(),
        )
    };
    let pool = (jobs > 1 && order.len() > 1)
        .then(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(jobs)
                .build()
                .ok()
        })
        .flatten();
    let Some(pool) = pool else {
        for i in 0..order.len() {
            let (view, refuted) = snapshot(grown, i);
            let r = walk.compute(order[i], &plans[i], view, &refuted);
            commit(grown, i, r)?;
        }
        return Ok(());
    };
    let after = last_writers(walk, order, plans);
    let (tx, rx) = mpsc::channel::<(usize, NodeResult)>();
    pool.in_place_scope(|scope| {
        let mut results: Vec<Option<NodeResult>> = (0..order.len()).map(|_| None).collect();
        let mut launched = vec![false; order.len()];
        let mut committed = 0;
        let mut in_flight = 0;
        while committed < order.len() {
            // Start what may start, oldest first, while workers are free.
            for i in committed..order.len().min(committed + WINDOW) {
                if in_flight >= jobs {
                    break;
                }
                if launched[i] || after[i].is_some_and(|w| w >= committed) {
                    continue;
                }
                launched[i] = true;
                in_flight += 1;
                let (view, refuted) = snapshot(grown, i);
                let (tx, plan, n) = (tx.clone(), &plans[i], order[i]);
                scope.spawn(move |_| {
                    // The receiver is gone only when the walk has stopped.
                    let _ = tx.send((i, walk.compute(n, plan, view, &refuted)));
                });
            }
            if results[committed].is_none() {
                let Ok((i, r)) = rx.recv() else { break };
                in_flight -= 1;
                results[i] = Some(r);
            }
            while let Some(r) = results.get_mut(committed).and_then(Option::take) {
                commit(grown, committed, r)?;
                committed += 1;
            }
        }
        Ok(())
    })
}

/// Per operator of `order`, the position of the last operator before it that writes a
/// relation it reads (its producer, or a view carried back onto it), if any.
fn last_writers(walk: &Walk, order: &[usize], plans: &[NodePlan]) -> Vec<Option<usize>> {
    let spec = &walk.case.spec;
    let position: HashMap<usize, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    // Per value, the positions of the views that may carry a relation back onto it.
    let mut viewed_back: HashMap<ValueId, Vec<usize>> = HashMap::new();
    for (i, &n) in order.iter().enumerate() {
        let node = &spec.nodes[n];
        if views_back(node) {
            if let Some(&x) = node.inputs().first() {
                viewed_back.entry(x).or_default().push(i);
            }
        }
    }
    (0..order.len())
        .map(|i| {
            plans[i]
                .reads
                .iter()
                .flat_map(|x| {
                    let producer = position.get(&x.node).copied().filter(|&p| p < i);
                    let views = viewed_back.get(x).into_iter().flatten();
                    producer
                        .into_iter()
                        .chain(views.copied().filter(|&p| p < i))
                })
                .max()
        })
        .collect()
}
