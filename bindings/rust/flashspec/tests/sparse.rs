//! Sparse draft distributions and stochastic trees through the safe crate
//! (CPU backend): a sparse chain given as a tree emits what it emits as a
//! chain; at T = 0 a stochastic tree follows the argmax walk, at T > 0 its
//! accepted path is a path of the tree; support slices the library would
//! read past their end are refused before the call; the library's own
//! refusals surface as its statuses.
mod common;

use common::{argmax_row, assert_library_error, context, refused_before_the_call, weights, Batch, Rng, D, V};
use flashspec::{sys, DraftSupport, VerifyBatch, VerifyResult, DRAFT_SUPPORT_TOLERANCE, MAX_DRAFT_SUPPORT, SHARD_RECORD_BYTES};

/// The owned arrays of a [`DraftSupport`].
struct Supports {
    offsets: Vec<i32>,
    tokens: Vec<i32>,
    probs: Vec<f32>,
}

impl Supports {
    /// A q per draft: `width` distinct tokens, the drafted one among them,
    /// with random probabilities summing to 1.
    fn new(rng: &mut Rng, drafts: &[i32], width: usize) -> Supports {
        let mut s = Supports { offsets: vec![0], tokens: Vec::new(), probs: Vec::new() };
        for &drafted in drafts {
            let mut row = vec![drafted];
            while row.len() < width {
                let t = rng.range(0, V as i64) as i32;
                if !row.contains(&t) {
                    row.push(t);
                }
            }
            row.swap(0, rng.range(0, width as i64) as usize);
            let weights: Vec<f64> = (0..width).map(|_| 0.05 + rng.unit()).collect();
            let sum: f64 = weights.iter().sum();
            s.probs.extend(weights.iter().map(|w| (w / sum) as f32));
            s.tokens.extend(row);
            s.offsets.push(s.tokens.len() as i32);
        }
        s
    }

    fn view(&self) -> DraftSupport<'_> {
        DraftSupport { offsets: &self.offsets, tokens: &self.tokens, probs: &self.probs }
    }
}

#[test]
fn constants_are_the_headers() {
    assert_eq!(MAX_DRAFT_SUPPORT, 64);
    assert_eq!(DRAFT_SUPPORT_TOLERANCE, 1e-3);
}

#[test]
fn a_sparse_chain_as_a_tree_emits_the_chains_tokens() {
    let ctx = context();
    let w = weights();
    let head = ctx.lm_head(&w, V, D).unwrap();
    let requests = 24;
    let b = Batch::new(&w, &mut Rng::new(6), vec![1.0; requests], false);
    let supports = Supports::new(&mut Rng::new(7), &b.drafts, 4);
    let chain = VerifyBatch { draft_support: Some(supports.view()), ..b.view() };
    let as_chain = ctx.verify_and_finalize(&head, &chain).unwrap();
    let as_tree = ctx.verify_and_finalize(&head, &VerifyBatch { draft_parents: Some(&b.parents[..]), ..chain.clone() }).unwrap();
    assert_eq!(as_chain.emitted_tokens, as_tree.emitted_tokens);
    assert_eq!(as_chain.accepted_counts, as_tree.accepted_counts);
    for r in 0..requests {
        let straight: Vec<i32> = (0..as_tree.accepted_counts[r]).collect();
        assert_eq!(as_tree.nodes(r), Some(&straight[..]), "request {r}: a chain's path");
    }
    assert!(as_chain.accepted_counts.iter().sum::<i32>() > 0, "no draft accepted: the comparison would not test the walk");
}

#[test]
fn a_stochastic_tree_at_zero_temperature_is_the_argmax_walk() {
    let ctx = context();
    let w = weights();
    let head = ctx.lm_head(&w, V, D).unwrap();
    let requests = 16;
    let b = Batch::new(&w, &mut Rng::new(5), vec![0.0; requests], true);
    let supports = Supports::new(&mut Rng::new(8), &b.drafts, 3);
    let result = ctx.verify_and_finalize(&head, &VerifyBatch { draft_support: Some(supports.view()), ..b.view() }).unwrap();
    let mut deepest = 0;
    for r in 0..requests {
        let (tokens, nodes) = b.greedy_walk(&w, r);
        assert_eq!(result.tokens(r), tokens, "request {r}");
        assert_eq!(result.nodes(r), Some(&nodes[..]), "request {r}");
        deepest = deepest.max(nodes.len());
    }
    assert!(deepest >= 2, "no path went two nodes deep: the walk would not test the tree");
}

/// Request r's accepted nodes go down the tree from the root, each emitted
/// token the drafted token of its node, and the slots past them are -1.
fn assert_path_of_the_tree(batch: &VerifyBatch<'_>, result: &VerifyResult, r: usize) {
    let (start, end) = (batch.draft_offsets[r] as usize, batch.draft_offsets[r + 1] as usize);
    let parents = &batch.draft_parents.unwrap()[start..end];
    let (nodes, tokens) = (result.nodes(r).unwrap(), result.tokens(r));
    assert_eq!(nodes.len() + 1, tokens.len());
    let mut parent = -1;
    for (k, &node) in nodes.iter().enumerate() {
        assert!(node >= 0 && (node as usize) < parents.len() && parents[node as usize] == parent, "path {nodes:?} leaves the tree {parents:?}");
        assert_eq!(tokens[k], batch.draft_tokens[start + node as usize], "token {k} is not node {node}'s draft");
        parent = node;
    }
    for slot in start + r + tokens.len()..end + r + 1 {
        assert_eq!((result.emitted_tokens[slot], result.accepted_nodes[slot]), (-1, -1), "slot {slot}");
    }
}

#[test]
fn a_stochastic_trees_path_is_a_path_of_the_tree() {
    let ctx = context();
    let w = weights();
    let head = ctx.lm_head(&w, V, D).unwrap();
    let mut rng = Rng::new(9);
    // Three root candidates (the last repeats the first's token and q), each
    // with one child; sparse q on even trials, dense draft logits on odd ones.
    let parents = [-1, -1, -1, 0, 1, 2];
    let mut depths = [0usize; 3];
    for trial in 0..40u64 {
        let hidden = rng.normals(7 * D, 1.0);
        // Root candidates are random (often rejected), their children the
        // argmax of their rows (often accepted): paths of every depth.
        let mut tokens: Vec<i32> = parents.iter().map(|&p| if p < 0 { rng.range(0, V as i64) as i32 } else { argmax_row(&w, &hidden, (p + 1) as usize) }).collect();
        tokens[2] = tokens[0];
        let mut supports = Supports::new(&mut rng, &tokens, 5);
        let (row0, row2) = (0..supports.offsets[1] as usize, supports.offsets[2] as usize..supports.offsets[3] as usize);
        supports.tokens.copy_within(row0.clone(), row2.start);
        supports.probs.copy_within(row0, row2.start);
        let mut logits = rng.normals(6 * V, 1.0);
        logits.copy_within(0..V, 2 * V);
        let ids = [trial];
        let mut batch = VerifyBatch {
            draft_offsets: &[0, 6],
            draft_tokens: &tokens,
            target_hidden: &hidden,
            draft_parents: Some(&parents),
            temperatures: Some(&[1.0]),
            request_ids: Some(&ids),
            ..Default::default()
        };
        if trial % 2 == 0 {
            batch.draft_support = Some(supports.view());
        } else {
            batch.draft_logits = Some(&logits);
        }
        let result = ctx.verify_and_finalize(&head, &batch).unwrap();
        assert_path_of_the_tree(&batch, &result, 0);
        depths[result.nodes(0).unwrap().len()] += 1;
    }
    assert!(depths[0] > 0 && depths[2] > 0, "path depths {depths:?}: the walk never stopped at the root or never reached a leaf");
}

/// One request of two drafts (4 and 9), each with a support of 3 tokens.
const OFFSETS: [i32; 3] = [0, 3, 6];
const TOKENS: [i32; 6] = [1, 4, 7, 9, 2, 30];
const PROBS: [f32; 6] = [0.25, 0.5, 0.25, 0.5, 0.25, 0.25];

fn sparse_batch<'a>(hidden: &'a [f32], support: DraftSupport<'a>) -> VerifyBatch<'a> {
    VerifyBatch { draft_offsets: &[0, 2], draft_tokens: &[4, 9], target_hidden: hidden, temperatures: Some(&[1.0]), draft_support: Some(support), ..Default::default() }
}

#[test]
fn short_support_slices_are_refused_before_the_call() {
    let ctx = context();
    let head = ctx.lm_head(&weights(), V, D).unwrap();
    let hidden = Rng::new(11).normals(3 * D, 1.0);
    let past_the_end = [0, 3, 7];
    let below_zero = [0, 3, -1];
    for (support, message) in [
        (DraftSupport { offsets: &OFFSETS[..2], tokens: &TOKENS, probs: &PROBS }, "draft_support.offsets: 2 entries for draft_offsets[R] + 1 = 3"),
        (DraftSupport { offsets: &[], tokens: &TOKENS, probs: &PROBS }, "draft_support.offsets: 0 entries for draft_offsets[R] + 1 = 3"),
        (DraftSupport { offsets: &OFFSETS, tokens: &TOKENS[..5], probs: &PROBS }, "draft_support.tokens: 5 entries for draft_support.offsets[2] = 6"),
        (DraftSupport { offsets: &OFFSETS, tokens: &TOKENS, probs: &PROBS[..5] }, "draft_support.probs: 5 entries for draft_support.offsets[2] = 6"),
        (DraftSupport { offsets: &past_the_end, tokens: &TOKENS, probs: &PROBS }, "draft_support.tokens: 6 entries for draft_support.offsets[2] = 7"),
        (DraftSupport { offsets: &below_zero, tokens: &TOKENS, probs: &PROBS }, "draft_support.offsets[2]: -1, below 0"),
    ] {
        let batch = sparse_batch(&hidden, support);
        let err = ctx.verify_and_finalize(&head, &batch).unwrap_err();
        assert_eq!(err.message, message);
        refused_before_the_call(&ctx, err, "draft_support");
        let mut summaries = ctx.summaries(16, 4).unwrap();
        refused_before_the_call(&ctx, ctx.verify(&head, &batch, &mut summaries).unwrap_err(), "draft_support");
    }
    // The whole batch goes through; longer slices keep their tails unread.
    ctx.verify_and_finalize(&head, &sparse_batch(&hidden, DraftSupport { offsets: &OFFSETS, tokens: &TOKENS, probs: &PROBS })).unwrap();
    let support = DraftSupport { offsets: &[0, 3, 6, 99], tokens: &[1, 4, 7, 9, 2, 30, -5], probs: &[0.25, 0.5, 0.25, 0.5, 0.25, 0.25, f32::NAN] };
    ctx.verify_and_finalize(&head, &sparse_batch(&hidden, support)).unwrap();
}

#[test]
fn the_librarys_refusals_surface() {
    let ctx = context();
    let head = ctx.lm_head(&weights(), V, D).unwrap();
    let hidden = Rng::new(11).normals(3 * D, 1.0);
    let with = |i: usize, t: i32| {
        let mut v = TOKENS;
        v[i] = t;
        v
    };
    let with_p = |changes: &[(usize, f32)]| {
        let mut v = PROBS;
        for &(i, p) in changes {
            v[i] = p;
        }
        v
    };
    let wide = MAX_DRAFT_SUPPORT as i32 + 1;
    let wide_offsets = [0, wide, wide + 1];
    let wide_tokens: Vec<i32> = (0..=wide).map(|i| if i < wide { i % V as i32 } else { 9 }).collect();
    let wide_probs: Vec<f32> = (0..=wide).map(|i| if i < wide { 1.0 / wide as f32 } else { 1.0 }).collect();
    let (twice, outside) = (with(0, 4), with(5, V as i32));
    let (off_sum, negative, infinite, zero_q) = (with_p(&[(0, 0.35)]), with_p(&[(0, -0.25), (1, 1.0)]), with_p(&[(4, f32::INFINITY)]), with_p(&[(0, 0.5), (1, 0.0), (2, 0.5)]));
    fn support<'a>(offsets: &'a [i32], tokens: &'a [i32], probs: &'a [f32]) -> DraftSupport<'a> {
        DraftSupport { offsets, tokens, probs }
    }
    let cases: Vec<(DraftSupport<'_>, sys::flashspec_status, &str)> = vec![
        (support(&OFFSETS, &twice, &PROBS), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_support_tokens: draft row 0 names token 4 twice"),
        (support(&OFFSETS, &outside, &PROBS), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_support_tokens"),
        (support(&OFFSETS, &TOKENS, &off_sum), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_support_probs: draft row 0 sums to"),
        (support(&OFFSETS, &TOKENS, &negative), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_support_probs"),
        (support(&OFFSETS, &TOKENS, &infinite), sys::FLASHSPEC_ERR_NON_FINITE, "batch->draft_support_probs"),
        (support(&OFFSETS, &TOKENS, &zero_q), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_tokens"),
        (support(&[1, 3, 6], &TOKENS, &PROBS), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_support_offsets"),
        (support(&wide_offsets, &wide_tokens, &wide_probs), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "has 65 support tokens, expected 1..64"),
    ];
    for (support, status, message) in cases {
        let err = ctx.verify_and_finalize(&head, &sparse_batch(&hidden, support)).unwrap_err();
        assert_library_error(err, status, message);
    }
    let not_in_support = VerifyBatch { draft_tokens: &[4, 3], ..sparse_batch(&hidden, support(&OFFSETS, &TOKENS, &PROBS)) };
    let err = ctx.verify_and_finalize(&head, &not_in_support).unwrap_err();
    assert_library_error(err, sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "is not in its row's draft support");
    let logits = vec![0.0f32; 2 * V];
    let both = VerifyBatch { draft_logits: Some(&logits), ..sparse_batch(&hidden, support(&OFFSETS, &TOKENS, &PROBS)) };
    assert_library_error(ctx.verify_and_finalize(&head, &both).unwrap_err(), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "not both");
    // Shard calls do not take sparse supports in this version.
    let shard = ctx.lm_head_shard(&weights()[..100 * D], 0..100, D, V).unwrap();
    let mut records = vec![0u8; 3 * SHARD_RECORD_BYTES];
    let err = ctx.verify_shard(&shard, &sparse_batch(&hidden, support(&OFFSETS, &TOKENS, &PROBS)), &mut records).unwrap_err();
    assert_library_error(err, sys::FLASHSPEC_ERR_UNSUPPORTED, "batch->draft_support_offsets");
}
