//! Vocabulary shards and tree verify through the safe crate (CPU backend).
//! Ranks are simulated in one process, each with the head of its slice of
//! one weight matrix, their records concatenated rank after rank as an
//! all-gather would. A sharded verify emits what the unsharded one does,
//! sharded drafts equal unsharded drafts, record buffers the library would
//! overrun are refused before the call, and malformed gathers surface the
//! library's INVALID_ARGUMENT.
mod common;

use common::{argmax_row, assert_library_error, context, refused_before_the_call, weights, Batch, Rng, D, V};
use flashspec::{sys, Context, DraftOptions, LmHead, SamplingControls, VerifyBatch, VerifyResult, SHARD_RECORD_BYTES, SHARD_RECORD_VERSION};

const B: usize = SHARD_RECORD_BYTES;
/// The byte offset of a record's int32 version (flashspec.h's layout).
const VERSION_OFFSET: usize = 32;
/// 1, 2 and 3 ranks, cut unevenly (a slice of a single token too).
const CUTS: [&[usize]; 3] = [&[0, V], &[0, 37, V], &[0, 1, 150, V]];

fn shard_heads<'c>(ctx: &'c Context, w: &[f32], cut: &[usize]) -> Vec<LmHead<'c>> {
    cut.windows(2).map(|s| ctx.lm_head_shard(&w[s[0] * D..s[1] * D], s[0]..s[1], D, V).unwrap()).collect()
}

fn gather_verify(ctx: &Context, heads: &[LmHead<'_>], batch: &VerifyBatch<'_>, rows: usize) -> Vec<u8> {
    let mut records = vec![0u8; heads.len() * rows * B];
    for (head, rank) in heads.iter().zip(records.chunks_mut(rows * B)) {
        ctx.verify_shard(head, batch, rank).unwrap();
    }
    records
}

fn gather_draft(ctx: &Context, heads: &[LmHead<'_>], hidden: &[f32], options: &DraftOptions<'_>) -> Vec<u8> {
    let rows = hidden.len() / D;
    let mut records = vec![0u8; heads.len() * rows * B];
    for (head, rank) in heads.iter().zip(records.chunks_mut(rows * B)) {
        ctx.draft_shard(head, hidden, options, rank).unwrap();
    }
    records
}

fn assert_same_emission(sharded: &VerifyResult, whole: &VerifyResult, context: &str) {
    assert_eq!(sharded.accepted_counts, whole.accepted_counts, "{context}");
    assert_eq!(sharded.emitted_tokens, whole.emitted_tokens, "{context}");
    assert_eq!(sharded.next_steps, whole.next_steps, "{context}");
    assert_eq!(sharded.accepted_nodes, whole.accepted_nodes, "{context}");
}

// ---- heads ------------------------------------------------------------------

#[test]
fn record_constants_are_the_headers() {
    assert_eq!((SHARD_RECORD_BYTES, SHARD_RECORD_VERSION), (48, 1));
}

#[test]
fn shard_heads_know_their_slice() {
    let ctx = context();
    let w = weights();
    let whole = ctx.lm_head(&w, V, D).unwrap();
    assert_eq!((whole.vocab_begin(), whole.vocab_size(), whole.global_vocab_size()), (0, V, V));
    let heads = shard_heads(&ctx, &w, CUTS[2]);
    let slices: Vec<_> = heads.iter().map(|h| (h.vocab_begin(), h.vocab_size(), h.global_vocab_size(), h.hidden_size())).collect();
    assert_eq!(slices, [(0, 1, V, D), (1, 149, V, D), (150, 50, V, D)]);
}

#[test]
fn bad_slices_and_misused_shard_heads_are_refused() {
    let ctx = context();
    let w = weights();
    let err = ctx.lm_head_shard(&w[..100 * D], 150..250, D, V).err().unwrap();
    assert_library_error(err, sys::FLASHSPEC_ERR_OUT_OF_RANGE, "vocab_begin");
    refused_before_the_call(&ctx, ctx.lm_head_shard(&[], usize::MAX..usize::MAX, D, usize::MAX).err().unwrap(), "slice");
    refused_before_the_call(&ctx, ctx.lm_head_shard(&w[..100 * D], 0..99, D, V).err().unwrap(), "weight");
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = ctx.lm_head_shard(&[], 5..3, D, V).err().unwrap();
    refused_before_the_call(&ctx, reversed, "slice");

    let shard = ctx.lm_head_shard(&w[..50 * D], 0..50, D, V).unwrap();
    let hidden = Rng::new(3).normals(3 * D, 1.0);
    assert_library_error(ctx.draft(&shard, &hidden, &DraftOptions::default()).unwrap_err(), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "head");
    let batch = VerifyBatch { draft_offsets: &[0, 2], draft_tokens: &[1, 2], target_hidden: &hidden, ..Default::default() };
    assert_library_error(ctx.verify_and_finalize(&shard, &batch).unwrap_err(), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "head");
}

// ---- sharded == unsharded -----------------------------------------------------

#[test]
fn sharded_verify_emits_the_unsharded_tokens() {
    let ctx = context();
    let w = weights();
    let whole_head = ctx.lm_head(&w, V, D).unwrap();
    let requests = 24;
    for (ranks, cut) in CUTS.iter().enumerate() {
        let heads = shard_heads(&ctx, &w, cut);
        for (label, temperatures) in [("T = 0", vec![0.0f32; requests]), ("T = 0.8", vec![0.8; requests]), ("mixed T", (0..requests).map(|r| if r % 2 == 1 { 0.0 } else { 1.1 }).collect())] {
            for tree in [false, true] {
                let context = format!("{} ranks, {label}, tree {tree}", ranks + 1);
                let b = Batch::new(&w, &mut Rng::new(10 * ranks as u64 + u64::from(tree) + 1), temperatures.clone(), tree);
                let batch = b.view();
                let whole = ctx.verify_and_finalize(&whole_head, &batch).unwrap();
                assert!(whole.accepted_counts.iter().sum::<i32>() > 0, "{context}: no draft accepted, the comparison would miss the acceptance test");
                assert_eq!(whole.accepted_nodes.is_empty(), !tree, "{context}");
                let records = gather_verify(&ctx, &heads, &batch, b.rows());
                let sharded = ctx.finalize_shards(&heads[0], &batch, &records, heads.len()).unwrap();
                assert_same_emission(&sharded, &whole, &context);
            }
        }
    }
}

#[test]
fn greedy_verify_is_the_argmax_walk_down_the_tree() {
    let ctx = context();
    let w = weights();
    let whole_head = ctx.lm_head(&w, V, D).unwrap();
    let heads = shard_heads(&ctx, &w, CUTS[2]);
    let requests = 16;
    for tree in [false, true] {
        let b = Batch::new(&w, &mut Rng::new(5), vec![0.0; requests], tree);
        let batch = b.view();
        let whole = ctx.verify_and_finalize(&whole_head, &batch).unwrap();
        let sharded = ctx.finalize_shards(&heads[1], &batch, &gather_verify(&ctx, &heads, &batch, b.rows()), heads.len()).unwrap();
        let (mut deepest, mut branched) = (0, false);
        for r in 0..requests {
            let (tokens, nodes) = b.greedy_walk(&w, r);
            for (name, result) in [("whole", &whole), ("sharded", &sharded)] {
                assert_eq!(result.tokens(r), tokens, "{name}, request {r}, tree {tree}");
                assert_eq!(result.nodes(r), tree.then_some(&nodes[..]), "{name}, request {r}, tree {tree}");
            }
            deepest = deepest.max(nodes.len());
            // A step a chain would not take: into a node that does not follow the last one.
            branched |= nodes.iter().enumerate().any(|(depth, &node)| node != depth as i32);
        }
        assert!(deepest >= 2, "no path went two nodes deep: the walk would not test the tree");
        assert_eq!(branched, tree, "the tree's paths would not tell it from a chain");
    }
}

#[test]
fn a_wrong_slice_changes_the_tokens() {
    // The comparisons above can fail: a rank holding other weights for its
    // slice (same tiling, so the records are well-formed) emits other tokens.
    let ctx = context();
    let w = weights();
    let b = Batch::new(&w, &mut Rng::new(8), vec![0.0; 24], false);
    let batch = b.view();
    let whole = ctx.verify_and_finalize(&ctx.lm_head(&w, V, D).unwrap(), &batch).unwrap();
    let mut wrong = w.clone();
    wrong[37 * D..].copy_from_slice(&Rng::new(9).normals((V - 37) * D, 1.0));
    let heads = shard_heads(&ctx, &wrong, CUTS[1]);
    let sharded = ctx.finalize_shards(&heads[0], &batch, &gather_verify(&ctx, &heads, &batch, b.rows()), 2).unwrap();
    assert_ne!(sharded.emitted_tokens, whole.emitted_tokens);
}

#[test]
fn sharded_drafts_equal_unsharded_drafts() {
    let ctx = context();
    let w = weights();
    let whole_head = ctx.lm_head(&w, V, D).unwrap();
    let rows = 12;
    let hidden = Rng::new(13).normals(rows * D, 1.0);
    let argmaxes: Vec<i32> = (0..rows).map(|r| argmax_row(&w, &hidden, r)).collect();
    let temperatures: Vec<f32> = (0..rows).map(|r| if r % 3 == 0 { 0.0 } else { 0.9 }).collect();
    let seeds: Vec<u64> = (5..5 + rows as u64).collect();
    let request_ids: Vec<u64> = (0..rows as u64).map(|r| r % 4).collect();
    let steps: Vec<u64> = (0..rows as u64).collect();
    let positions: Vec<i32> = (0..rows as i32).map(|r| r % 3).collect();
    let greedy = DraftOptions::default();
    let per_row = DraftOptions { temperatures: Some(&temperatures), seeds: Some(&seeds), request_ids: Some(&request_ids), steps: Some(&steps), positions: Some(&positions), ..Default::default() };
    let scalar = DraftOptions { temperature: 1.3, seeds: Some(&seeds), ..Default::default() };
    for (ranks, cut) in CUTS.iter().enumerate() {
        let heads = shard_heads(&ctx, &w, cut);
        for (label, options) in [("greedy", &greedy), ("per-row T", &per_row), ("scalar T", &scalar)] {
            let context = format!("{} ranks, {label}", ranks + 1);
            let (tokens, scores) = ctx.draft(&whole_head, &hidden, options).unwrap();
            if label == "greedy" {
                assert_eq!(tokens, argmaxes, "{context}");
            } else {
                assert_ne!(tokens, argmaxes, "{context}: sampling drew only argmaxes");
            }
            let records = gather_draft(&ctx, &heads, &hidden, options);
            let (sharded_tokens, sharded_scores) = ctx.draft_from_shards(&records, heads.len(), options).unwrap();
            assert_eq!(sharded_tokens, tokens, "{context}");
            for (s, u) in sharded_scores.iter().zip(&scores) {
                assert!((s - u).abs() <= 1e-5 * u.abs().max(1.0), "{context}: score {s} vs {u}");
            }
        }
    }
}

// ---- record buffers the crate refuses before the call ---------------------------

#[test]
fn record_buffers_are_checked_before_the_call() {
    let ctx = context();
    let w = weights();
    let head = ctx.lm_head_shard(&w[..100 * D], 0..100, D, V).unwrap();
    let hidden = Rng::new(3).normals(3 * D, 1.0);
    let batch = VerifyBatch { draft_offsets: &[0, 2], draft_tokens: &[5, 6], target_hidden: &hidden, temperatures: Some(&[0.0]), ..Default::default() };
    // Leave a library error as the context's last, to tell the crate's refusals from it.
    assert!(ctx.lm_head_shard(&w[..100 * D], 150..250, D, V).is_err());
    let mut buffer = vec![0xABu8; 4 * 3 * B];
    for short in [0, 3 * B - 1, 2 * B] {
        refused_before_the_call(&ctx, ctx.verify_shard(&head, &batch, &mut buffer[..short]).unwrap_err(), "records");
        refused_before_the_call(&ctx, ctx.draft_shard(&head, &hidden, &DraftOptions { temperature: 0.5, ..Default::default() }, &mut buffer[..short]).unwrap_err(), "records");
    }
    assert!(buffer.iter().all(|&b| b == 0xAB), "a refused call wrote the records");

    // Long enough: the rows' records are written, nothing past them.
    for len in [3 * B, 5 * B] {
        let mut records = vec![0u8; len];
        ctx.verify_shard(&head, &batch, &mut records).unwrap();
        for row in records[..3 * B].chunks(B) {
            assert_eq!(i32::from_le_bytes(row[VERSION_OFFSET..VERSION_OFFSET + 4].try_into().unwrap()), SHARD_RECORD_VERSION);
        }
        assert!(records[3 * B..].iter().all(|&b| b == 0), "wrote past the batch's rows");
        ctx.draft_shard(&head, &hidden, &DraftOptions::default(), &mut records).unwrap();
        assert!(records[3 * B..].iter().all(|&b| b == 0), "wrote past the hidden rows");
    }
}

#[test]
fn gathered_records_must_be_exactly_the_ranks_rows() {
    let ctx = context();
    let w = weights();
    let heads = shard_heads(&ctx, &w, CUTS[1]);
    let hidden = Rng::new(3).normals(3 * D, 1.0);
    let batch = VerifyBatch { draft_offsets: &[0, 2], draft_tokens: &[5, 6], target_hidden: &hidden, temperatures: Some(&[0.0]), ..Default::default() };
    let records = gather_verify(&ctx, &heads, &batch, 3);
    assert!(ctx.lm_head_shard(&w[..100 * D], 150..250, D, V).is_err());
    let mut longer = records.clone();
    longer.extend_from_slice(&[0; B]);
    for (bytes, shards) in [(&records[..], 0), (&records[..], 1), (&records[..], 3), (&records[..records.len() - 1], 2), (&records[..records.len() - B], 2), (&longer[..], 2)] {
        refused_before_the_call(&ctx, ctx.finalize_shards(&heads[0], &batch, bytes, shards).unwrap_err(), "records");
    }
    let whole = ctx.verify_and_finalize(&ctx.lm_head(&w, V, D).unwrap(), &batch).unwrap();
    assert_same_emission(&ctx.finalize_shards(&heads[0], &batch, &records, 2).unwrap(), &whole, "the exact gather");

    let drafts = gather_draft(&ctx, &heads, &hidden, &DraftOptions::default());
    for (bytes, shards) in [(&drafts[..0], 2), (&drafts[..], 0), (&drafts[..drafts.len() - 1], 2), (&drafts[..], 4)] {
        refused_before_the_call(&ctx, ctx.draft_from_shards(bytes, shards, &DraftOptions::default()).unwrap_err(), "records");
    }
    let one_seed = [1u64];
    refused_before_the_call(&ctx, ctx.draft_from_shards(&drafts, 2, &DraftOptions { seeds: Some(&one_seed), ..Default::default() }).unwrap_err(), "seeds");
}

// ---- malformed gathers: the library's error ------------------------------------

/// Well-sized gathers of three ranks' records that are not what the library
/// reads: (label, records, num_shards).
fn malformed(records: &[u8], rows: usize) -> Vec<(&'static str, Vec<u8>, usize)> {
    let rank = |k: usize| &records[k * rows * B..(k + 1) * rows * B];
    let mut versioned = records.to_vec();
    let field = rows * B + 2 * B + VERSION_OFFSET; // rank 1, row 2
    versioned[field..field + 4].copy_from_slice(&(SHARD_RECORD_VERSION + 1).to_le_bytes());
    vec![
        ("another version", versioned, 3),
        ("ranks out of order", [rank(2), rank(1), rank(0)].concat(), 3),
        ("a rank missing", [rank(0), rank(1)].concat(), 2),
        ("a rank twice", [rank(0), rank(1), rank(1), rank(2)].concat(), 4),
    ]
}

#[test]
fn malformed_gathers_are_the_librarys_invalid_argument() {
    let ctx = context();
    let w = weights();
    let heads = shard_heads(&ctx, &w, CUTS[2]);
    let hidden = Rng::new(4).normals(3 * D, 1.0);
    let batch = VerifyBatch { draft_offsets: &[0, 2], draft_tokens: &[5, 6], target_hidden: &hidden, temperatures: Some(&[0.0]), ..Default::default() };
    let records = gather_verify(&ctx, &heads, &batch, 3);
    let drafts = gather_draft(&ctx, &heads, &hidden, &DraftOptions::default());
    for ((label, bad, shards), (_, bad_drafts, _)) in malformed(&records, 3).into_iter().zip(malformed(&drafts, 3)) {
        let err = ctx.finalize_shards(&heads[0], &batch, &bad, shards).unwrap_err();
        assert_eq!(err.status, sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "{label}: {err}");
        assert!(err.message.starts_with("records"), "{label}: {err}");
        assert_eq!(ctx.last_error(), err.message, "{label}");
        let err = ctx.draft_from_shards(&bad_drafts, shards, &DraftOptions::default()).unwrap_err();
        assert_eq!(err.status, sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "{label}: {err}");
        assert!(err.message.starts_with("records"), "{label}: {err}");
    }
    // The well-formed gathers are accepted.
    ctx.finalize_shards(&heads[0], &batch, &records, 3).unwrap();
    ctx.draft_from_shards(&drafts, 3, &DraftOptions::default()).unwrap();
}

#[test]
fn calls_needing_a_second_exchange_are_unsupported() {
    let ctx = context();
    let w = weights();
    let head = ctx.lm_head_shard(&w[..100 * D], 0..100, D, V).unwrap();
    let hidden = Rng::new(3).normals(3 * D, 1.0);
    let mut records = vec![0u8; 3 * B];
    let logits = vec![0.0f32; 2 * V]; // rows of the global vocabulary
    let base = VerifyBatch { draft_offsets: &[0, 2], draft_tokens: &[5, 6], target_hidden: &hidden, ..Default::default() };
    let stochastic = VerifyBatch { draft_logits: Some(&logits), ..base.clone() };
    assert_library_error(ctx.verify_shard(&head, &stochastic, &mut records).unwrap_err(), sys::FLASHSPEC_ERR_UNSUPPORTED, "draft_logits");
    assert_library_error(ctx.verify_shard(&head, &VerifyBatch { logprobs: true, ..base.clone() }, &mut records).unwrap_err(), sys::FLASHSPEC_ERR_UNSUPPORTED, "logprobs");
    let top_k = [5, 5, 5];
    let controlled = DraftOptions { controls: Some(SamplingControls { top_k: Some(&top_k), ..Default::default() }), ..Default::default() };
    assert_library_error(ctx.draft_shard(&head, &hidden, &controlled, &mut records).unwrap_err(), sys::FLASHSPEC_ERR_UNSUPPORTED, "controls");
}

// ---- tree verify on a whole head ---------------------------------------------------

#[test]
fn draft_parents_are_checked() {
    let ctx = context();
    let w = weights();
    let head = ctx.lm_head(&w, V, D).unwrap();
    let hidden = Rng::new(3).normals(3 * D, 1.0);
    let tree = |parents: &'static [i32]| VerifyBatch { draft_offsets: &[0, 2], draft_tokens: &[5, 6], target_hidden: &hidden, draft_parents: Some(parents), ..Default::default() };
    assert!(ctx.lm_head_shard(&w[..100 * D], 150..250, D, V).is_err());
    refused_before_the_call(&ctx, ctx.verify_and_finalize(&head, &tree(&[-1])).unwrap_err(), "draft_parents");
    assert_library_error(ctx.verify_and_finalize(&head, &tree(&[-1, 1])).unwrap_err(), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "draft_parents");
    let result = ctx.verify_and_finalize(&head, &tree(&[-1, -1])).unwrap();
    assert_eq!(result.accepted_nodes.len(), 3);
    let chain = ctx.verify_and_finalize(&head, &VerifyBatch { draft_parents: None, ..tree(&[]) }).unwrap();
    assert!(chain.accepted_nodes.is_empty() && chain.nodes(0).is_none());
}
