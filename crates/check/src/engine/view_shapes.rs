//! The global shapes a view reads where local shapes leave it open: those a value's
//! placements imply ([`implied_global`]), and the spec's beside a `Varying` mesh dim
//! ([`view_beside_varying`]).

use crate::place::Place;

/// The global shape a value's placements imply: its local shape with every dim that a mesh
/// dim shards (plainly, in blocks, or as rows of a selection) multiplied by that mesh dim's
/// size; `None` where some mesh dim holds it in a layout without one (varying, a ring's
/// pieces, gathered pieces, unknown).
pub(super) fn implied_global(
    local: &[usize],
    places: &[Place],
    mesh_sizes: &[usize],
) -> Option<Vec<i64>> {
    let mut global: Vec<i64> = local.iter().map(|&l| l as i64).collect();
    for (m, p) in places.iter().enumerate() {
        let n = *mesh_sizes.get(m)? as i64;
        match p {
            Place::Shard(d) | Place::Blocked(d, _) | Place::Rows(d, _) => {
                *global.get_mut(*d as usize)? *= n;
            }
            Place::Replicate | Place::Partial(_) => {}
            _ => return None,
        }
    }
    Some(global)
}

/// The spec's view for a rank's view whose input some mesh dims hold `Varying` (a ring
/// backward's per-rank partial or record beside dp's and tp's shards), in the frame of one
/// coordinate of those mesh dims: the input shape is the local one scaled by the other mesh
/// dims' shards only (`Varying` takes no factor), and the output shape the spec's on the dims
/// the view reshapes, the input's frame on the dims it keeps. The view must keep every dim
/// outside one contiguous group (same local sizes before and after it), and the spec's view
/// must reshape the same group, with exactly the scaled sizes there: a `Varying` mesh dim whose
/// pieces met the group would leave the spec's group larger than the shards make it. Every
/// spec view of `op` that qualifies must give the same output; `None` otherwise. The view rule
/// reads `Varying` as taking no elements apart only against input shapes of this frame.
pub(super) fn view_beside_varying(
    candidates: &[&super::shared::SpecView],
    op: &str,
    local_in: &[usize],
    local_out: &[usize],
    places: &[Place],
    mesh_sizes: &[usize],
) -> Option<(Vec<i64>, Vec<i64>)> {
    let mut frame: Vec<i64> = local_in.iter().map(|&l| l as i64).collect();
    let mut varying = false;
    for (m, p) in places.iter().enumerate() {
        let n = *mesh_sizes.get(m)? as i64;
        match p {
            Place::Shard(d) | Place::Blocked(d, _) | Place::Rows(d, _) => {
                let g = frame.get_mut(*d as usize)?;
                *g = g.checked_mul(n)?;
            }
            Place::Replicate | Place::Partial(_) => {}
            Place::Varying | Place::Accrued(_) => varying = true,
            _ => return None,
        }
    }
    if !varying {
        return None;
    }
    // The group the local view reshapes: the dims between its kept prefix and kept suffix,
    // at least one on each side (a size-1 dim split off a kept one joins the group).
    let prefix = local_in
        .iter()
        .zip(local_out)
        .take_while(|(a, b)| a == b)
        .count();
    let suffix = local_in[prefix..]
        .iter()
        .rev()
        .zip(local_out[prefix..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count()
        .min(
            local_in
                .len()
                .min(local_out.len())
                .saturating_sub(prefix + 1),
        );
    let (in_end, out_end) = (local_in.len() - suffix, local_out.len() - suffix);
    if prefix >= in_end || prefix >= out_end {
        return None;
    }
    let mut found: Option<Vec<i64>> = None;
    for (sop, gi, go) in candidates.iter().copied() {
        if sop.name != op || gi.len() != local_in.len() || go.len() != local_out.len() {
            continue;
        }
        let (g_in_end, g_out_end) = (gi.len() - suffix, go.len() - suffix);
        let keeps = gi[..prefix] == go[..prefix] && gi[g_in_end..] == go[g_out_end..];
        let group_scaled = gi[prefix..g_in_end] == frame[prefix..in_end];
        let holds_local = go[prefix..g_out_end]
            .iter()
            .zip(&local_out[prefix..out_end])
            .all(|(&g, &l)| l > 0 && g >= l as i64 && g % l as i64 == 0);
        if !(keeps && group_scaled && holds_local) {
            continue;
        }
        let mut out = frame[..prefix].to_vec();
        out.extend_from_slice(&go[prefix..g_out_end]);
        out.extend_from_slice(&frame[in_end..]);
        match &found {
            None => found = Some(out),
            Some(f) if *f == out => {}
            Some(_) => return None,
        }
    }
    Some((frame, found?))
}

#[cfg(test)]
mod beside_varying_tests {
    use super::super::shared;
    use super::*;
    use shardproof_ir::OpName;

    /// 051's ring backward: `[b*h, n, d] -> [b, h, n, d]`, dp `Shard(0)`, cp `Varying`, tp
    /// `Blocked(0, 2)`, the spec's view `[8, 8, 4] -> [2, 4, 8, 4]` (cp's factor on `n`).
    const PLACES: [Place; 3] = [Place::Shard(0), Place::Varying, Place::Blocked(0, 2)];
    const MESH: [usize; 3] = [2, 2, 2];

    fn read(specs: &[(Vec<i64>, Vec<i64>)]) -> Option<(Vec<i64>, Vec<i64>)> {
        let op = OpName::new("aten", "view", "default");
        let owned: Vec<shared::SpecView> = specs
            .iter()
            .map(|(gi, go)| (&op, gi.clone(), go.clone()))
            .collect();
        let candidates: Vec<&shared::SpecView> = owned.iter().collect();
        view_beside_varying(
            &candidates,
            "view",
            &[2, 4, 4],
            &[1, 2, 4, 4],
            &PLACES,
            &MESH,
        )
    }

    #[test]
    fn the_spec_split_of_the_reshaped_group_in_the_frame_of_one_varying_coordinate() {
        let read = read(&[(vec![8, 8, 4], vec![2, 4, 8, 4])]);
        assert_eq!(read, Some((vec![8, 4, 4], vec![2, 4, 4, 4])));
    }

    /// The spec's reshaped group holds more than dp's and tp's pieces make (a varying mesh
    /// dim's pieces met it): no frame.
    #[test]
    fn a_reshaped_group_larger_than_the_shards_make_it_is_not_read() {
        assert_eq!(read(&[(vec![16, 8, 4], vec![4, 4, 8, 4])]), None);
        assert_eq!(read(&[(vec![16, 8, 4], vec![2, 8, 8, 4])]), None);
    }

    /// Two spec views of that input that split the group in other orders (`[b, h]` and
    /// `[h, b]`): which one this is, is open.
    #[test]
    fn spec_views_splitting_the_group_in_other_orders_are_not_read() {
        let specs = [
            (vec![8, 8, 4], vec![2, 4, 8, 4]),
            (vec![8, 8, 4], vec![4, 2, 8, 4]),
        ];
        assert_eq!(read(&specs), None);
    }

    /// A spec view that reshapes a dim the local view keeps is another view.
    #[test]
    fn a_spec_view_reshaping_a_kept_dim_is_not_read() {
        assert_eq!(read(&[(vec![8, 8, 4], vec![2, 4, 4, 8])]), None);
    }

    /// Without a varying mesh dim the global shape is implied: this reading is not asked.
    #[test]
    fn no_varying_mesh_dim_no_frame() {
        let op = OpName::new("aten", "view", "default");
        let spec: shared::SpecView = (&op, vec![8, 8, 4], vec![2, 4, 8, 4]);
        let places = [Place::Shard(0), Place::Replicate, Place::Blocked(0, 2)];
        let read = view_beside_varying(&[&spec], "view", &[2, 4, 4], &[1, 2, 4, 4], &places, &MESH);
        assert_eq!(read, None);
    }
}
