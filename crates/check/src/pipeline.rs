//! Pipeline schedules: GPipe, 1F1B and interleaved 1F1B orders for S stages x M microbatches
//! (x V virtual stages per device), and their check for deadlock (a cycle in the wait-for
//! graph of the devices' recvs), completeness (every microbatch's forward and backward on
//! every virtual stage, once, the backward after the forward) and gradient synchronization
//! (once per device, after its last backward).
//!
//! An order is one list of [`Action`]s per device: compute steps and the messages they imply
//! (a forward on virtual stage v receives its activation from v-1 and sends its output to
//! v+1; a backward receives its gradient from v+1 and sends the input gradient to v-1). Sends
//! are buffered (`isend`), a recv waits for its send: the semantics of the IR's
//! `shardproof_p2p`. The same check runs on the order a program's sends and recvs follow
//! ([`order_of_program`]).
//!
//! ```
//! use shardproof_check::pipeline::{build, check_order, PipelineKind, PipelineSpec};
//! let spec = PipelineSpec { kind: PipelineKind::OneFOneB, stages: 4, microbatches: 8, virtual_stages: 1 };
//! let order = build(&spec).unwrap();
//! assert!(check_order(&order).is_empty());
//! ```

use shardproof_ir::{Arg, NodeKind, Program};
use shardproof_ops::{p2p_node_call, program_members, P2pEnd};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// The schedule family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineKind {
    /// Every forward, then every backward.
    GPipe,
    /// One forward, one backward (PipeDream-Flush): a warm-up of forwards, a steady state of
    /// alternating forward and backward, a cool-down of backwards.
    OneFOneB,
    /// Megatron's interleaved 1F1B: each device holds V model chunks.
    Interleaved,
}

/// What to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineSpec {
    /// The schedule family.
    pub kind: PipelineKind,
    /// Devices (pipeline stages).
    pub stages: usize,
    /// Microbatches.
    pub microbatches: usize,
    /// Model chunks per device (1 unless interleaved).
    pub virtual_stages: usize,
}

/// Forward or backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// The forward pass.
    Forward,
    /// The backward pass.
    Backward,
}

/// A compute step: a microbatch's forward or backward on one of the device's chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Work {
    /// Forward or backward.
    pub phase: Phase,
    /// The microbatch.
    pub microbatch: usize,
    /// The virtual stage (chunk c of device d is virtual stage c * S + d).
    pub virtual_stage: usize,
}

/// A message: what its sender computed (activation of a forward, gradient of a backward).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Message {
    /// The step that produced it.
    pub work: Work,
}

/// One action of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A compute step.
    Compute(Work),
    /// A buffered send to device `to`.
    Send {
        /// The receiving device.
        to: usize,
        /// The message.
        message: Message,
    },
    /// A recv from device `from`: waits for the send.
    Recv {
        /// The sending device.
        from: usize,
        /// The message.
        message: Message,
    },
    /// The data-parallel gradient all-reduce (or reduce-scatter) of the device's parameters.
    GradSync,
}

impl fmt::Display for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = match self.phase {
            Phase::Forward => 'F',
            Phase::Backward => 'B',
        };
        write!(
            f,
            "{p}{} (virtual stage {})",
            self.microbatch, self.virtual_stage
        )
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Compute(w) => write!(f, "{w}"),
            Action::Send { to, message } => write!(f, "send {} to device {to}", message.work),
            Action::Recv { from, message } => {
                write!(f, "recv {} from device {from}", message.work)
            }
            Action::GradSync => f.write_str("gradient sync"),
        }
    }
}

/// An order: per device, its actions in program order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineOrder {
    /// Devices.
    pub stages: usize,
    /// Microbatches (`None` when read from a program that does not say).
    pub microbatches: usize,
    /// Chunks per device.
    pub virtual_stages: usize,
    /// Per device, its actions.
    pub devices: Vec<Vec<Action>>,
    /// Whether the order has a backward (orders of forward-only programs have none).
    pub backward: bool,
    /// Whether gradient synchronization is part of the order (built orders; programs with a
    /// data-parallel mesh dim).
    pub grad_sync: bool,
}

/// What is wrong with an order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PipelineProblem {
    /// Devices that wait for each other in a cycle: each (device, action index) waits at a
    /// recv for the next device in the list, and the last for the first.
    Deadlock(Vec<(usize, usize)>),
    /// A device waits at a recv for a message its sender never sends (or sent already to
    /// another recv).
    NeverSent {
        /// The waiting device.
        device: usize,
        /// The recv's index in its actions.
        action: usize,
    },
    /// A compute step missing on a device.
    Missing {
        /// The device.
        device: usize,
        /// The step.
        work: Work,
    },
    /// A compute step run more than once.
    Duplicate {
        /// The device.
        device: usize,
        /// The step.
        work: Work,
    },
    /// A backward before its forward on the same device (it needs the forward's activations).
    BackwardBeforeForward {
        /// The device.
        device: usize,
        /// The step.
        work: Work,
    },
    /// Gradient synchronization missing, repeated, or before the device's last backward.
    GradSync {
        /// The device.
        device: usize,
        /// What is wrong.
        message: String,
    },
}

impl PipelineProblem {
    /// The problem in words, naming devices and actions of `order`.
    pub fn describe(&self, order: &PipelineOrder) -> String {
        let at = |d: usize, i: usize| {
            order.devices[d]
                .get(i)
                .map_or("?".into(), |a| format!("device {d} at `{a}`"))
        };
        match self {
            PipelineProblem::Deadlock(cycle) => {
                let parts: Vec<String> = cycle.iter().map(|&(d, i)| at(d, i)).collect();
                format!(
                    "deadlock: a cycle in the wait-for graph: {} (each waits for the next, the last for the first)",
                    parts.join(" -> ")
                )
            }
            PipelineProblem::NeverSent { device, action } => format!(
                "{} waits for a message its sender never sends",
                at(*device, *action)
            ),
            PipelineProblem::Missing { device, work } => {
                format!("device {device} never runs {work}")
            }
            PipelineProblem::Duplicate { device, work } => {
                format!("device {device} runs {work} more than once")
            }
            PipelineProblem::BackwardBeforeForward { device, work } => {
                format!("device {device} runs {work} before its forward")
            }
            PipelineProblem::GradSync { device, message } => {
                format!("device {device}: {message}")
            }
        }
    }
}

/// The compute steps of one device, in order, for `spec` (chunk c of device d is virtual
/// stage c * S + d).
fn compute_order(spec: &PipelineSpec, device: usize) -> Vec<Work> {
    let (s, m, v) = (spec.stages, spec.microbatches, spec.virtual_stages);
    let work = |phase, microbatch, chunk: usize| Work {
        phase,
        microbatch,
        virtual_stage: chunk * s + device,
    };
    match spec.kind {
        PipelineKind::GPipe => {
            let mut out = Vec::new();
            for chunk in 0..v {
                out.extend((0..m).map(|mb| work(Phase::Forward, mb, chunk)));
            }
            for chunk in (0..v).rev() {
                out.extend((0..m).map(|mb| work(Phase::Backward, mb, chunk)));
            }
            out
        }
        PipelineKind::OneFOneB | PipelineKind::Interleaved => {
            // The k-th forward (backward) of the device: Megatron's interleaved order, in
            // groups of S microbatches per chunk; with V = 1 it is plain 1F1B.
            let total = m * v;
            let nth = |k: usize, phase: Phase| {
                let group = k / s;
                let chunk = group % v;
                let chunk = if phase == Phase::Backward {
                    v - 1 - chunk
                } else {
                    chunk
                };
                let mb = (k / (s * v)) * s + k % s;
                work(phase, mb, chunk)
            };
            let warmup = if v == 1 {
                (s - device - 1).min(m)
            } else {
                ((s - device - 1) * 2 + (v - 1) * s).min(total)
            };
            let mut out = Vec::new();
            let (mut f, mut b) = (0, 0);
            while f < warmup {
                out.push(nth(f, Phase::Forward));
                f += 1;
            }
            while f < total {
                out.push(nth(f, Phase::Forward));
                f += 1;
                out.push(nth(b, Phase::Backward));
                b += 1;
            }
            while b < total {
                out.push(nth(b, Phase::Backward));
                b += 1;
            }
            out
        }
    }
}

/// Builds the order of `spec`: every device's compute steps with the recvs before and the
/// sends after each, and the gradient sync at the end.
pub fn build(spec: &PipelineSpec) -> Result<PipelineOrder, String> {
    let (s, m, v) = (spec.stages, spec.microbatches, spec.virtual_stages);
    if s == 0 || m == 0 || v == 0 {
        return Err("stages, microbatches and virtual stages must be at least 1".into());
    }
    match spec.kind {
        PipelineKind::Interleaved if m % s != 0 => {
            return Err(format!(
                "interleaved 1F1B runs microbatches in groups of the {s} stages: {m} microbatches is not a multiple"
            ))
        }
        PipelineKind::GPipe | PipelineKind::OneFOneB if v != 1 => {
            return Err("virtual stages are for the interleaved schedule".into())
        }
        _ => {}
    }
    let last = s * v - 1;
    let device_of = |vs: usize| vs % s;
    let devices = (0..s)
        .map(|d| {
            let mut acts = Vec::new();
            for w in compute_order(spec, d) {
                let vs = w.virtual_stage;
                let (from, to) = match w.phase {
                    Phase::Forward => ((vs > 0).then(|| vs - 1), (vs < last).then(|| vs + 1)),
                    Phase::Backward => ((vs < last).then(|| vs + 1), (vs > 0).then(|| vs - 1)),
                };
                if let Some(src) = from {
                    acts.push(Action::Recv {
                        from: device_of(src),
                        message: Message {
                            work: Work {
                                virtual_stage: src,
                                ..w
                            },
                        },
                    });
                }
                acts.push(Action::Compute(w));
                if let Some(dst) = to {
                    acts.push(Action::Send {
                        to: device_of(dst),
                        message: Message { work: w },
                    });
                }
            }
            acts.push(Action::GradSync);
            acts
        })
        .collect();
    Ok(PipelineOrder {
        stages: s,
        microbatches: m,
        virtual_stages: v,
        devices,
        backward: true,
        grad_sync: true,
    })
}

/// Checks `order`: deadlock, completeness, backward after forward, gradient sync.
pub fn check_order(order: &PipelineOrder) -> Vec<PipelineProblem> {
    let mut out = deadlock(order);
    let (s, v, m) = (order.stages, order.virtual_stages, order.microbatches);
    for (d, acts) in order.devices.iter().enumerate() {
        let mut seen: BTreeMap<Work, usize> = BTreeMap::new();
        for a in acts {
            if let Action::Compute(w) = a {
                if w.phase == Phase::Backward
                    && !seen.contains_key(&Work {
                        phase: Phase::Forward,
                        ..*w
                    })
                {
                    out.push(PipelineProblem::BackwardBeforeForward {
                        device: d,
                        work: *w,
                    });
                }
                *seen.entry(*w).or_default() += 1;
            }
        }
        let phases: &[Phase] = if order.backward {
            &[Phase::Forward, Phase::Backward]
        } else {
            &[Phase::Forward]
        };
        for chunk in 0..v {
            for mb in 0..m {
                for &phase in phases {
                    let work = Work {
                        phase,
                        microbatch: mb,
                        virtual_stage: chunk * s + d,
                    };
                    match seen.get(&work).copied().unwrap_or(0) {
                        0 => out.push(PipelineProblem::Missing { device: d, work }),
                        1 => {}
                        _ => out.push(PipelineProblem::Duplicate { device: d, work }),
                    }
                }
            }
        }
        if order.grad_sync {
            let syncs: Vec<usize> = (0..acts.len())
                .filter(|&i| acts[i] == Action::GradSync)
                .collect();
            let last_backward = acts.iter().rposition(|a| {
                matches!(a, Action::Compute(w) if w.phase == Phase::Backward)
                    || matches!(a, Action::Recv { message, .. } | Action::Send { message, .. } if message.work.phase == Phase::Backward)
            });
            let early = syncs
                .iter()
                .find(|&&i| last_backward.is_some_and(|b| b > i));
            if syncs.is_empty() {
                out.push(PipelineProblem::GradSync {
                    device: d,
                    message: "its gradients are never synchronized".into(),
                });
            } else if let Some(i) = early {
                out.push(PipelineProblem::GradSync {
                    device: d,
                    message: format!(
                        "its gradients are synchronized at action {i}, before its last backward (action {}): later microbatches' gradients miss the sync",
                        last_backward.unwrap_or(0)
                    ),
                });
            }
        }
    }
    out
}

/// Runs the devices with buffered sends until nothing moves; the devices left waiting form
/// the wait-for graph (each waits for its recv's sender).
fn deadlock(order: &PipelineOrder) -> Vec<PipelineProblem> {
    let n = order.devices.len();
    let mut pc = vec![0usize; n];
    let mut posted: HashMap<(usize, usize, Message), usize> = HashMap::new();
    loop {
        let mut moved = false;
        for (d, counter) in pc.iter_mut().enumerate() {
            while let Some(a) = order.devices[d].get(*counter) {
                match *a {
                    Action::Send { to, message } => {
                        *posted.entry((d, to, message)).or_default() += 1;
                    }
                    Action::Recv { from, message } => {
                        match posted.get_mut(&(from, d, message)).filter(|c| **c > 0) {
                            Some(c) => *c -= 1,
                            None => break,
                        }
                    }
                    Action::Compute(_) | Action::GradSync => {}
                }
                *counter += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    let waits_for = |d: usize| match order.devices[d].get(pc[d]) {
        Some(Action::Recv { from, .. }) if *from < n => Some(*from),
        _ => None,
    };
    let mut out = Vec::new();
    let mut reported: BTreeSet<usize> = BTreeSet::new();
    for start in 0..n {
        if waits_for(start).is_none() || reported.contains(&start) {
            continue;
        }
        // Follow the wait-for edges (one per waiting device) until a device repeats (a
        // cycle) or one is not waiting (it finished without sending).
        let mut path = vec![start];
        let mut d = start;
        loop {
            match waits_for(d) {
                Some(next) => {
                    if let Some(k) = path.iter().position(|&x| x == next) {
                        let cycle: Vec<usize> = path[k..].to_vec();
                        let mut key = cycle.clone();
                        key.sort_unstable();
                        if cycle.iter().all(|c| !reported.contains(c)) {
                            reported.extend(cycle.iter().copied());
                            // Start the cycle at its lowest device, for determinism.
                            let lo = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
                            let rotated: Vec<(usize, usize)> = (0..cycle.len())
                                .map(|i| {
                                    let c = cycle[(lo + i) % cycle.len()];
                                    (c, pc[c])
                                })
                                .collect();
                            out.push(PipelineProblem::Deadlock(rotated));
                        }
                        break;
                    }
                    path.push(next);
                    d = next;
                }
                None => {
                    // `path`'s last device waits for one that finished or is itself
                    // blocked elsewhere: the message it waits for is never sent.
                    let last = path.len().saturating_sub(2);
                    let waiting = path[last.min(path.len() - 1)];
                    if reported.insert(waiting) {
                        out.push(PipelineProblem::NeverSent {
                            device: waiting,
                            action: pc[waiting],
                        });
                    }
                    break;
                }
            }
        }
    }
    out
}

/// The order a program's sends and recvs follow along mesh dim `pp`, for the pipeline
/// through rank `first` (the ranks that differ from it only along `pp`): per stage, its
/// messages in program order. A message's tag is its microbatch; messages to a later stage
/// are forward activations, to an earlier one backward gradients (the zoo's and Megatron's
/// convention; interleaved programs, whose last stage sends forward to the first, are not
/// read). With a `dp` mesh dim, the all-reduces and reduce-scatters over it are the gradient
/// syncs. `None` when the ranks exchange no message along `pp`.
pub fn order_of_program(program: &Program, pp: usize, first: usize) -> Option<PipelineOrder> {
    order_with_dp_groups(program, pp, first, &dp_group_names(program))
}

/// The groups over exactly the data-parallel mesh dim (`dp`): their all-reduces and
/// reduce-scatters synchronize the gradients. The same for every pipeline of a program, so
/// read once ([`order_with_dp_groups`]).
pub(crate) fn dp_group_names(program: &Program) -> BTreeSet<&str> {
    let mesh = &program.mesh;
    let dp = mesh.dim_index("dp").filter(|&d| mesh.dims[d].1 > 1);
    program
        .groups
        .iter()
        .filter(|g| dp.is_some() && crate::group_dims(mesh, &g.members) == dp.map(|d| vec![d]))
        .map(|g| g.name.as_str())
        .collect()
}

/// [`order_of_program`] with the program's [`dp_group_names`] given.
pub(crate) fn order_with_dp_groups(
    program: &Program,
    pp: usize,
    first: usize,
    dp_groups: &BTreeSet<&str>,
) -> Option<PipelineOrder> {
    let mesh = &program.mesh;
    let stages = mesh.dims.get(pp)?.1;
    let base = mesh.coords(first);
    let rank_of = |s: usize| {
        let mut c = base.clone();
        c[pp] = s;
        mesh.rank(&c)
    };
    let stage_of: HashMap<usize, usize> = (0..stages).map(|s| (rank_of(s), s)).collect();
    let mut devices = Vec::with_capacity(stages);
    let mut microbatches = 0;
    let mut backward = false;
    for s in 0..stages {
        let g = program.ranks.get(rank_of(s))?;
        let members = program_members(program, rank_of(s));
        let mut acts = Vec::new();
        for node in &g.nodes {
            let NodeKind::Call { op, args, kwargs } = &node.kind else {
                continue;
            };
            if op.namespace == "_c10d_functional"
                && matches!(op.name.as_str(), "all_reduce" | "reduce_scatter_tensor")
            {
                let group = args.iter().rev().find_map(|a| match a {
                    Arg::Str(s) => Some(s.as_str()),
                    _ => None,
                });
                if group.is_some_and(|g| dp_groups.contains(g)) {
                    acts.push(Action::GradSync);
                }
                continue;
            }
            if op.namespace != shardproof_ops::P2P_NAMESPACE {
                continue;
            }
            // The global peer (a group-relative one resolved); a call whose peer does not
            // resolve is the schedule's finding, not a message of this order.
            let Some(Ok(call)) = p2p_node_call(op, args, kwargs, &members) else {
                continue;
            };
            let (peer, tag, send) = (call.peer, call.tag, call.end == P2pEnd::Send);
            let Some(&other) = stage_of.get(&peer) else {
                continue;
            };
            let mb = usize::try_from(tag).unwrap_or(0);
            microbatches = microbatches.max(mb + 1);
            // Who computed the message: the sender.
            let (from, to) = if send { (s, other) } else { (other, s) };
            let phase = if to > from {
                Phase::Forward
            } else {
                Phase::Backward
            };
            backward |= phase == Phase::Backward;
            let work = Work {
                phase,
                microbatch: mb,
                virtual_stage: from,
            };
            // The step a message witnesses on this stage: a forward received starts this
            // stage's forward, a forward sent ends it (and likewise backward).
            acts.push(Action::Compute(Work {
                virtual_stage: s,
                ..work
            }));
            acts.push(if send {
                Action::Send {
                    to: other,
                    message: Message { work },
                }
            } else {
                Action::Recv {
                    from: other,
                    message: Message { work },
                }
            });
        }
        devices.push(acts);
    }
    if devices.iter().all(Vec::is_empty) {
        return None;
    }
    // Tags are microbatches only where they are 0, 1, ... with none skipped (in each
    // direction); a program that numbers its messages otherwise is not read.
    for phase in [Phase::Forward, Phase::Backward] {
        let tags: BTreeSet<usize> = devices
            .iter()
            .flatten()
            .filter_map(|a| match a {
                Action::Send { message, .. } | Action::Recv { message, .. }
                    if message.work.phase == phase =>
                {
                    Some(message.work.microbatch)
                }
                _ => None,
            })
            .collect();
        if tags.last().is_some_and(|&t| t + 1 != tags.len()) {
            return None;
        }
    }
    // A step witnessed by both its recv and its send appears twice: keep the first.
    for acts in &mut devices {
        let mut seen = BTreeSet::new();
        acts.retain(|a| match a {
            Action::Compute(w) => seen.insert(*w),
            _ => true,
        });
    }
    Some(PipelineOrder {
        stages,
        microbatches,
        virtual_stages: 1,
        devices,
        backward,
        grad_sync: backward && !dp_groups.is_empty(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: PipelineKind, s: usize, m: usize, v: usize) -> PipelineSpec {
        PipelineSpec {
            kind,
            stages: s,
            microbatches: m,
            virtual_stages: v,
        }
    }

    #[test]
    fn correct_orders_of_every_kind_pass() {
        for (s, m) in [(1, 1), (2, 2), (4, 8), (3, 5), (8, 16)] {
            for kind in [PipelineKind::GPipe, PipelineKind::OneFOneB] {
                let o = build(&spec(kind, s, m, 1)).unwrap();
                let p = check_order(&o);
                assert!(p.is_empty(), "{kind:?} {s}x{m}: {p:?}");
            }
        }
        for (s, m, v) in [(2, 4, 2), (4, 8, 2), (4, 8, 3), (2, 2, 4)] {
            let o = build(&spec(PipelineKind::Interleaved, s, m, v)).unwrap();
            let p = check_order(&o);
            assert!(p.is_empty(), "interleaved {s}x{m}x{v}: {p:?}");
        }
    }

    #[test]
    fn one_f_one_b_keeps_at_most_s_microbatches_in_flight() {
        let o = build(&spec(PipelineKind::OneFOneB, 4, 8, 1)).unwrap();
        for (d, acts) in o.devices.iter().enumerate() {
            let mut live: i64 = 0;
            let mut peak = 0;
            for a in acts {
                if let Action::Compute(w) = a {
                    live += if w.phase == Phase::Forward { 1 } else { -1 };
                    peak = peak.max(live);
                }
            }
            assert_eq!(peak, (4 - d) as i64, "device {d}");
        }
    }

    #[test]
    fn swapped_send_and_recv_deadlocks_with_the_cycle_reported() {
        let mut o = build(&spec(PipelineKind::OneFOneB, 2, 2, 1)).unwrap();
        // Device 0: move its first backward recv before its first forward send.
        let d0 = &mut o.devices[0];
        let send = d0
            .iter()
            .position(|a| matches!(a, Action::Send { .. }))
            .unwrap();
        let recv = d0
            .iter()
            .position(|a| matches!(a, Action::Recv { .. }))
            .unwrap();
        let r = d0.remove(recv);
        d0.insert(send, r);
        let p = check_order(&o);
        let PipelineProblem::Deadlock(cycle) = &p[0] else {
            panic!("{p:?}")
        };
        assert_eq!(cycle.iter().map(|c| c.0).collect::<Vec<_>>(), vec![0, 1]);
        let text = p[0].describe(&o);
        assert!(text.contains("device 0 at `recv B0"), "{text}");
        assert!(text.contains("device 1 at `recv F0"), "{text}");
    }

    #[test]
    fn a_missing_microbatch_is_reported() {
        let mut o = build(&spec(PipelineKind::GPipe, 2, 3, 1)).unwrap();
        // Drop microbatch 2 everywhere: its steps and messages.
        for acts in &mut o.devices {
            acts.retain(|a| match a {
                Action::Compute(w) => w.microbatch != 2,
                Action::Send { message, .. } | Action::Recv { message, .. } => {
                    message.work.microbatch != 2
                }
                Action::GradSync => true,
            });
        }
        let p = check_order(&o);
        assert!(p.contains(&PipelineProblem::Missing {
            device: 1,
            work: Work {
                phase: Phase::Backward,
                microbatch: 2,
                virtual_stage: 1
            }
        }));
        assert_eq!(
            p.iter()
                .filter(|x| matches!(x, PipelineProblem::Missing { .. }))
                .count(),
            4
        );
    }

    #[test]
    fn a_recv_never_sent_and_an_early_grad_sync_are_reported() {
        let mut o = build(&spec(PipelineKind::OneFOneB, 2, 2, 1)).unwrap();
        // Device 1 never sends its last gradient back.
        let last_send = o.devices[1]
            .iter()
            .rposition(|a| matches!(a, Action::Send { .. }))
            .unwrap();
        o.devices[1].remove(last_send);
        // Device 1 syncs its gradients before its last backward.
        let sync = o.devices[1].pop().unwrap();
        o.devices[1].insert(2, sync);
        let p = check_order(&o);
        assert!(
            p.iter()
                .any(|x| matches!(x, PipelineProblem::NeverSent { device: 0, .. })),
            "{p:?}"
        );
        assert!(
            p.iter()
                .any(|x| matches!(x, PipelineProblem::GradSync { device: 1, .. })),
            "{p:?}"
        );
    }

    #[test]
    fn interleaved_needs_groups_of_stages() {
        assert!(build(&spec(PipelineKind::Interleaved, 4, 6, 2)).is_err());
        assert!(build(&spec(PipelineKind::OneFOneB, 4, 6, 2)).is_err());
    }
}
