//! The suffix drafter (its trees and its place in the engine) and the
//! engine's draft length options from Rust.
use flashspec::{sys, Context, DraftLenRule, EngineOptions, GenerateOptions, SuffixOptions, MAX_DRAFT_LEN};

mod common;
use common::{assert_library_error, refused_before_the_call, Rng};

/// A periodic text: the suffix trie has seen every continuation.
const PERIODIC: [i32; 12] = [4, 8, 15, 16, 23, 42, 4, 8, 15, 16, 23, 42];

#[test]
fn propose_tree_is_a_tree_of_indexed_tokens_best_first() {
    let ctx = Context::cpu(1).unwrap();
    let mut drafter = ctx.suffix_drafter(&SuffixOptions { min_probability: 0.0, ..Default::default() }).unwrap();
    let context = [PERIODIC.as_slice(), &[4, 8, 15, 9, 4, 8, 15]].concat();
    let tree = drafter.propose_tree(&context, 8).unwrap();
    assert!(!tree.tokens.is_empty() && tree.tokens.len() <= 8);
    assert_eq!(tree.tokens.len(), tree.parents.len());
    // After "4 8 15" came 16 twice and 9 once: 16 is the best first node.
    assert_eq!((tree.tokens[0], tree.parents[0]), (16, -1));
    for (i, (&t, &p)) in tree.tokens.iter().zip(&tree.parents).enumerate() {
        assert!(context.contains(&t), "node {i}: token {t} was never indexed");
        assert!(p >= -1 && p < i as i32, "node {i}: parent {p}");
        let siblings = (0..i).filter(|&j| tree.parents[j] == p && tree.tokens[j] == t).count();
        assert_eq!(siblings, 0, "node {i}: two children of {p} with token {t}");
    }
    assert!(tree.tokens.iter().zip(&tree.parents).any(|(&t, &p)| p == -1 && t == 9), "the rarer branch is in an 8-node tree");
    // The first n nodes of a larger budget are the tree of budget n.
    for n in 1..tree.tokens.len() {
        let smaller = drafter.propose_tree(&context, n).unwrap();
        assert_eq!((&smaller.tokens[..], &smaller.parents[..]), (&tree.tokens[..n], &tree.parents[..n]), "budget {n}");
    }
    assert!(drafter.propose_tree(&context, 0).unwrap().tokens.is_empty());
    // Nothing indexed matches a fresh token: no tree.
    let mut fresh = ctx.suffix_drafter(&SuffixOptions::default()).unwrap();
    assert!(fresh.propose_tree(&[1, 2, 3], 4).unwrap().tokens.is_empty());
}

#[test]
fn propose_tree_bad_input() {
    let ctx = Context::cpu(1).unwrap();
    let mut drafter = ctx.suffix_drafter(&SuffixOptions::default()).unwrap();
    drafter.propose_tree(&PERIODIC, 1).unwrap(); // a known last error
    refused_before_the_call(&ctx, drafter.propose_tree(&PERIODIC, MAX_DRAFT_LEN + 1).unwrap_err(), "max_nodes");
    assert_library_error(drafter.propose_tree(&[], 4).unwrap_err(), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "context_len");
    assert_library_error(drafter.propose_tree(&[3, -1], 4).unwrap_err(), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "context");
    let mut ngram = ctx.ngram_drafter(&Default::default()).unwrap();
    assert_library_error(ngram.propose_tree(&PERIODIC, 4).unwrap_err(), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "drafter");
    // The drafter still works after the refusals.
    assert!(!drafter.propose_tree(&PERIODIC, 4).unwrap().tokens.is_empty());

    let refused = |options: SuffixOptions, status, name: &str| assert_library_error(ctx.suffix_drafter(&options).err().unwrap(), status, name);
    refused(SuffixOptions { max_match_len: 0, ..Default::default() }, sys::FLASHSPEC_ERR_OUT_OF_RANGE, "max_match_len");
    refused(SuffixOptions { max_depth: 65, ..Default::default() }, sys::FLASHSPEC_ERR_OUT_OF_RANGE, "max_depth");
    refused(SuffixOptions { min_probability: f64::NAN, ..Default::default() }, sys::FLASHSPEC_ERR_OUT_OF_RANGE, "min_probability");
    refused(SuffixOptions { cache_max_tokens: -1, ..Default::default() }, sys::FLASHSPEC_ERR_OUT_OF_RANGE, "cache_max_tokens");
    refused(SuffixOptions { token_cost: -1.0, ..Default::default() }, sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "cost");
}

#[test]
fn defaults_are_the_librarys() {
    let s = SuffixOptions::default();
    assert_eq!((s.max_match_len, s.max_depth, s.min_probability, s.cache_max_tokens), (16, 16, 0.1, 16384));
    let e = EngineOptions::default();
    assert_eq!((e.draft_len_rule, e.draft_len_memory), (DraftLenRule::Arm, 64.0));
}

const V: usize = 24;
const D: usize = 8;

/// A target whose next token depends on the last one only: its greedy text
/// is periodic, which a suffix drafter learns.
fn engine_tokens(ctx: &Context, options: EngineOptions<'_>, w: &[f32], e: &[f32]) -> (Vec<i32>, flashspec::EngineMetrics) {
    let head = ctx.lm_head(w, V, D).unwrap();
    let mut cache: Vec<i32> = Vec::new();
    let forward = |tokens: &[i32], num_past: usize, num_rows: usize| -> flashspec::CallbackResult<Vec<f32>> {
        cache.truncate(num_past);
        cache.extend_from_slice(tokens);
        Ok(cache[cache.len() - num_rows..].iter().flat_map(|&t| e[t as usize * D..(t as usize + 1) * D].to_vec()).collect())
    };
    let mut engine = ctx.engine(&head, forward, options).unwrap();
    let g = engine.generate(&[1, 2, 3], &GenerateOptions { temperature: 0.0, max_tokens: 40, ..Default::default() }).unwrap();
    (g.tokens, engine.metrics().unwrap())
}

fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.unit() * 2.0 - 1.0) as f32).collect()
}

#[test]
fn suffix_drafter_and_adaptive_draft_length_keep_greedy_decoding() {
    let ctx = Context::cpu(2).unwrap();
    let (w, e) = (random(31, V * D), random(32, V * D));
    let (plain, _) = engine_tokens(&ctx, EngineOptions::default(), &w, &e);
    for rule in [DraftLenRule::Arm, DraftLenRule::Adaptive] {
        let options = EngineOptions { drafters: vec![ctx.suffix_drafter(&SuffixOptions::default()).unwrap()], default_draft_len: 6, draft_len_rule: rule, draft_len_memory: 8.0, ..Default::default() };
        let (tokens, metrics) = engine_tokens(&ctx, options, &w, &e);
        assert_eq!(tokens, plain, "{rule:?}");
        // A greedy text of 40 tokens over 24 ids repeats: the drafter was accepted.
        assert!(metrics.accepted_tokens > 0 && metrics.steps < 40, "{rule:?}: {metrics:?}");
    }
    let bad = EngineOptions { draft_len_rule: DraftLenRule::Adaptive, draft_len_memory: 0.5, ..Default::default() };
    let head = ctx.lm_head(&w, V, D).unwrap();
    let err = ctx.engine(&head, |_: &[i32], _, _| Ok(vec![]), bad).err().unwrap();
    assert_library_error(err, sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "draft_len_memory");
}
