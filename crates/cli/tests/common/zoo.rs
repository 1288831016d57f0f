//! The emit-and-run scaffolding of the zoo tests: emit a zoo case into a scratch directory,
//! run an engine on it, and assert the exit code and the verdict (a correct plan holds, a
//! planted catalog bug is found naming an output it changes, a request the zoo cannot serve
//! is refused).

use super::{first_mismatch, Out, Scratch};
use shardproof_zoo::{find_bug, Bug, Site, BUGS};

/// The flags of a plan that needs none beyond its model and mesh.
pub const NO_FLAGS: &[&str] = &[];

impl Scratch {
    /// `zoo emit ARGS -o DIR` (DIR relative to the directory), whatever it exits with.
    pub fn zoo_emit<S: AsRef<str>>(&self, dir: &str, args: &[S]) -> Out {
        let mut all = vec!["zoo", "emit"];
        all.extend(args.iter().map(AsRef::as_ref));
        all.extend(["-o", dir]);
        self.run(&all)
    }

    /// `zoo emit ARGS -o DIR`, which must succeed; returns the case file's path `DIR/case.yaml`.
    #[track_caller]
    pub fn emit_case<S: AsRef<str>>(&self, dir: &str, args: &[S]) -> String {
        self.zoo_emit(dir, args).expect_code(0);
        format!("{dir}/case.yaml")
    }

    /// `zoo emit MODEL --mesh MESH FLAGS -o DIR`, which must succeed; returns the case path.
    #[track_caller]
    pub fn emit_model<S: AsRef<str>>(
        &self,
        dir: &str,
        model: &str,
        mesh: &str,
        flags: &[S],
    ) -> String {
        let mut args = vec![model, "--mesh", mesh];
        args.extend(flags.iter().map(AsRef::as_ref));
        self.emit_case(dir, &args)
    }

    /// `zoo emit` with the words of `request` (model and flags on one line) must exit 2 with
    /// `message` on stderr.
    #[track_caller]
    pub fn assert_emit_refused(&self, request: &str, message: &str) {
        self.zoo_emit("refused", &words(request))
            .expect_code(2)
            .stderr_has(&[message]);
    }

    /// The text of `path` (relative to the directory).
    #[track_caller]
    pub fn read(&self, path: &str) -> String {
        let p = self.path().join(path);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    }

    /// `run` holds on `case`; returns what it printed.
    #[track_caller]
    pub fn assert_holds(&self, case: &str) -> Out {
        let out = self.run(&["run", case]);
        out.expect_code(0).stdout_has(&["verdict: holds"]);
        out
    }

    /// `inspect --strict` accepts `case` (every recorded type checks).
    #[track_caller]
    pub fn assert_strict(&self, case: &str) {
        self.run(&["inspect", "--strict", case]).expect_code(0);
    }

    /// `run` holds on `case` and `inspect --strict` accepts it.
    #[track_caller]
    pub fn assert_holds_strictly(&self, case: &str) {
        self.assert_holds(case);
        self.assert_strict(case);
    }

    /// `run` fails on `case` (exit 1); returns what it printed and the first mismatching
    /// output it names.
    #[track_caller]
    pub fn run_mismatch(&self, case: &str) -> (Out, String) {
        let out = self.run(&["run", case]);
        out.expect_code(1);
        let first = first_mismatch(&out);
        (out, first)
    }

    /// `run` finds catalog bug `bug` planted in `case`: exit 1, the first mismatching output
    /// the loss when the bug changes it, an updated weight (`<param>_new`) otherwise.
    #[track_caller]
    pub fn assert_bug_found(&self, case: &str, bug: &str) {
        let (out, first) = self.run_mismatch(case);
        assert_names_changed_output(catalog_bug(bug), &first, bug, &out);
    }
}

/// The catalog entry `id`.
#[track_caller]
pub fn catalog_bug(id: &str) -> &'static Bug {
    find_bug(id).unwrap_or_else(|| panic!("`{id}` is not a catalog bug"))
}

/// `first` (the first mismatching output of `out`, `run` on a plan planting `bug`) is the
/// loss when the bug changes it, an updated weight (`<param>_new`) otherwise; `what` names
/// the plan in the failure message.
#[track_caller]
pub fn assert_names_changed_output(bug: &Bug, first: &str, what: &str, out: &Out) {
    if bug.changes_loss {
        assert_eq!(first, "loss", "{what}\n{}", out.stdout);
    } else {
        assert!(first.ends_with("_new"), "{what}: {first}\n{}", out.stdout);
    }
}

/// The prefix of the output `run` names first for a deepseek plan planting `bug`: the loss
/// when the bug changes it, else the updated weights it corrupts (the routers' or the
/// experts').
pub fn deepseek_changed_output(bug: &Bug) -> &'static str {
    if bug.changes_loss {
        "loss"
    } else if bug.id == "moe-router-grad-unsynced" {
        "router_"
    } else {
        "expert_"
    }
}

/// Plants into `DIR-BUG`, one case each, every catalog bug that `run` can catch and that
/// `applies` to the plan `args` (model, mesh and flags; the numerically invisible bugs are
/// checked in zoo_bugs_extra.rs); returns each bug with its case's path.
#[track_caller]
pub fn plant_bugs(
    s: &Scratch,
    dir: &str,
    args: &[&str],
    applies: impl Fn(&Bug) -> bool,
) -> Vec<(&'static Bug, String)> {
    BUGS.iter()
        .filter(|b| b.run_catches() && applies(b))
        .map(|bug| {
            let mut with_bug = args.to_vec();
            with_bug.extend(["--bug", bug.id]);
            (bug, s.emit_case(&format!("{dir}-{}", bug.id), &with_bug))
        })
        .collect()
}

/// Emits the correct plan `args` (model, mesh and flags) into `dir`: `run` holds and
/// `inspect --strict` accepts it. Then plants every catalog bug that `applies` ([`plant_bugs`]):
/// `inspect --strict` accepts each case and `run` finds the bug, naming an output it changes.
/// Returns the ids planted.
#[track_caller]
pub fn check_plan_and_bugs(
    s: &Scratch,
    dir: &str,
    args: &[&str],
    applies: impl Fn(&Bug) -> bool,
) -> Vec<&'static str> {
    let case = s.emit_case(dir, args);
    s.assert_holds_strictly(&case);
    let planted = plant_bugs(s, dir, args, applies);
    for (bug, case) in &planted {
        s.assert_strict(case);
        let (out, first) = s.run_mismatch(case);
        assert_names_changed_output(bug, &first, &format!("{args:?} --bug {}", bug.id), &out);
    }
    planted.iter().map(|(bug, _)| bug.id).collect()
}

/// Plants every catalog bug that applies to the deepseek plan `args` (model, mesh and flags) at
/// `site` on a mesh of `ep` expert-parallel ranks ([`plant_bugs`]): `run` finds each, naming
/// first an output of the kind the bug changes ([`deepseek_changed_output`]). Returns the ids
/// planted.
#[track_caller]
pub fn check_moe_bugs(
    s: &Scratch,
    dir: &str,
    args: &[&str],
    site: &Site,
    ep: usize,
) -> Vec<&'static str> {
    let applies = |bug: &Bug| bug.check_applies_with_ep(site, ep).is_ok();
    let planted = plant_bugs(s, dir, args, applies);
    for (bug, case) in &planted {
        let (_, first) = s.run_mismatch(case);
        let expected = deepseek_changed_output(bug);
        assert!(first.starts_with(expected), "{args:?} {}: {first}", bug.id);
    }
    planted.iter().map(|(bug, _)| bug.id).collect()
}

/// The words of `text`: command-line arguments written on one line.
pub fn words(text: &str) -> Vec<&str> {
    text.split_whitespace().collect()
}

/// The peer of each `shardproof_p2p` message of `graph` as written, `index@group` for a
/// group-relative one (the zoo's: `send.default(x, dst, tag, 'cp')`), the global rank
/// otherwise: the `dst` of a send, the `src` of a recv.
pub fn p2p_peers(graph: &str) -> Vec<String> {
    p2p_calls(graph)
        .iter()
        .map(|c| {
            let args = c.rsplit(')').nth(1).unwrap_or(c);
            let fields: Vec<&str> = args.rsplit(", ").collect();
            match fields[0]
                .strip_prefix('\'')
                .and_then(|g| g.strip_suffix('\''))
            {
                Some(group) => format!("{}@{group}", fields[2]),
                None => fields[1].to_string(),
            }
        })
        .collect()
}

/// The `shardproof_p2p` calls of `graph`, each the text after `torch.ops.shardproof_p2p.`.
pub fn p2p_calls(graph: &str) -> Vec<&str> {
    graph
        .lines()
        .filter_map(|l| l.split("torch.ops.shardproof_p2p.").nth(1))
        .collect()
}

/// `text` contains every one of `pieces`.
#[track_caller]
pub fn assert_has_all(text: &str, pieces: &[&str]) {
    for piece in pieces {
        assert!(text.contains(piece), "{piece}\n{text}");
    }
}
