//! Tree steps from Rust: a tree drafter whose right child comes after a
//! decoy, a target whose forward runs the tree (each node's row from its
//! path: its own token and its parent's), with the keep closure and
//! without; at T = 0 the engines emit the target's greedy tokens.
use std::cell::RefCell;
use std::rc::Rc;

use flashspec::{Arm, BatchEngineOptions, CallbackDrafterOptions, Context, ContextOptions, Backend, DraftTree, EngineOptions, GenerateOptions, Policy, TargetCall};

const V: usize = 16;
const PROMPT: [i32; 4] = [3, 1, 4, 1];

/// The target's greedy next token after `..., a, b`.
fn next(context: &[i32]) -> i32 {
    let b = context[context.len() - 1] as usize;
    let a = if context.len() > 1 { context[context.len() - 2] as usize } else { 0 };
    ((3 * b + a + 1) % V) as i32
}

/// W = 4·I: the target's row after a context is the one-hot of next(context).
fn head_weights() -> Vec<f32> {
    (0..V * V).map(|i| if i / V == i % V { 4.0 } else { 0.0 }).collect()
}

fn greedy(n: usize) -> Vec<i32> {
    let mut context = PROMPT.to_vec();
    for _ in 0..n {
        context.push(next(&context));
    }
    context[PROMPT.len()..].to_vec()
}

/// Per level: a decoy (with a child of its own), then the right token,
/// whose subtree is the next level.
fn decoy_tree(context: &[i32], max: usize) -> flashspec::CallbackResult<DraftTree> {
    let mut tree = DraftTree::default();
    let mut path = context.to_vec();
    let mut parent = -1;
    while tree.tokens.len() + 3 <= max {
        let right = next(&path);
        let decoy = (right + 5) % V as i32;
        tree.tokens.extend([decoy, (decoy + 1) % V as i32, right]);
        let base = tree.tokens.len() as i32 - 3;
        tree.parents.extend([parent, base, parent]);
        parent = base + 2;
        path.push(right);
    }
    Ok(tree)
}

/// The rows of a forward: token t's context is the cache's first num_past
/// tokens, then its path through the call (parents[t], or t - 1).
fn rows(cache: &[i32], tokens: &[i32], parents: Option<&[i32]>, num_rows: usize) -> Vec<f32> {
    let mut out = Vec::new();
    for t in tokens.len() - num_rows..tokens.len() {
        let mut path = Vec::new();
        let mut i = t as i32;
        while i >= 0 {
            path.push(tokens[i as usize]);
            i = match parents {
                Some(p) if p[i as usize] >= 0 => p[i as usize],
                _ => i - 1,
            };
        }
        let mut context = cache.to_vec();
        context.extend(path.iter().rev());
        let mut row = vec![0.0f32; V];
        row[next(&context) as usize] = 1.0;
        out.extend(row);
    }
    out
}

fn context() -> Context {
    Context::new(&ContextOptions { backend: Backend::Cpu, seed: 5, cpu_threads: 1, max_rows: 64, ..Default::default() }).unwrap()
}

#[test]
fn greedy_tree_engine_equals_greedy_decoding_with_and_without_keep() {
    let ctx = context();
    let weights = head_weights();
    let head = ctx.lm_head(&weights, V, V).unwrap();
    for with_keep in [true, false] {
        // The host's KV cache, and how often it saw parents and keeps.
        let cache = Rc::new(RefCell::new((Vec::<i32>::new(), 0usize, 0usize)));
        let (forward_cache, keep_cache) = (cache.clone(), cache.clone());
        let forward = move |call: &TargetCall<'_>| {
            let mut c = forward_cache.borrow_mut();
            if call.num_past > c.0.len() {
                return Err(format!("num_past {} beyond the cache of {}", call.num_past, c.0.len()).into());
            }
            c.0.truncate(call.num_past);
            let out = rows(&c.0, call.tokens, call.parents, call.num_rows);
            c.0.extend_from_slice(call.tokens);
            c.1 += usize::from(call.parents.is_some());
            Ok(out)
        };
        let keep = move |num_past: usize, keep: &[i32]| -> flashspec::CallbackResult<()> {
            let mut c = keep_cache.borrow_mut();
            let kept: Vec<i32> = keep.iter().map(|&i| c.0[num_past + i as usize]).collect();
            c.0.truncate(num_past);
            c.0.extend(kept);
            c.2 += 1;
            Ok(())
        };
        let drafter = ctx.tree_drafter(decoy_tree, &CallbackDrafterOptions::default()).unwrap();
        let options = EngineOptions {
            keep: if with_keep { Some(Box::new(keep)) } else { None },
            drafters: vec![drafter],
            arms: Some(vec![Arm { drafter: Some(0), draft_len: 9 }]),
            policy: Policy::Fixed(0),
            ..Default::default()
        };
        let mut engine = ctx.tree_engine(&head, forward, options).unwrap();
        let out = engine.generate(&PROMPT, &GenerateOptions { temperature: 0.0, max_tokens: 30, ..Default::default() }).unwrap();
        assert_eq!(out.tokens, greedy(30), "with_keep {with_keep}");
        let metrics = engine.metrics().unwrap();
        // Right children below decoys were accepted: paths deeper than one.
        assert!(metrics.accepted_tokens > metrics.steps, "{metrics:?}");
        let (_, tree_forwards, keeps) = *cache.borrow();
        assert_eq!(tree_forwards as u64, metrics.drafts);
        assert_eq!(keeps > 0, with_keep);
    }
}

#[test]
fn a_chain_forward_refuses_a_tree_step() {
    let ctx = context();
    let weights = head_weights();
    let head = ctx.lm_head(&weights, V, V).unwrap();
    let drafter = ctx.tree_drafter(decoy_tree, &CallbackDrafterOptions::default()).unwrap();
    let options = EngineOptions { drafters: vec![drafter], arms: Some(vec![Arm { drafter: Some(0), draft_len: 6 }]), ..Default::default() };
    let mut engine = ctx.engine(&head, |tokens, _, num_rows| Ok(rows(&[], tokens, None, num_rows)), options).unwrap();
    let err = engine.generate(&PROMPT, &GenerateOptions { temperature: 0.0, max_tokens: 8, ..Default::default() }).unwrap_err();
    assert_eq!(err.status(), flashspec::sys::FLASHSPEC_ERR_CALLBACK);
    assert!(err.to_string().contains("Context::tree_engine"), "{err}");
}

#[test]
fn batched_tree_sequences_equal_greedy_decoding() {
    let ctx = context();
    let weights = head_weights();
    let head = ctx.lm_head(&weights, V, V).unwrap();
    let caches = Rc::new(RefCell::new(std::collections::HashMap::<u64, Vec<i32>>::new()));
    let keeps = Rc::new(RefCell::new(0usize));
    let (forward_caches, keep_caches, keep_count) = (caches.clone(), caches.clone(), keeps.clone());
    let forward = move |call: &flashspec::BatchForward<'_>| -> flashspec::CallbackResult<Vec<f32>> {
        let mut caches = forward_caches.borrow_mut();
        let mut out = Vec::new();
        for s in 0..call.num_sequences() {
            let cache = caches.entry(call.sequence_ids[s]).or_default();
            cache.truncate(call.num_past[s] as usize);
            out.extend(rows(cache, call.tokens_of(s), call.parents_of(s), call.rows_of(s)));
            cache.extend_from_slice(call.tokens_of(s));
        }
        Ok(out)
    };
    let keep = move |id: u64, num_past: usize, keep: &[i32]| -> flashspec::CallbackResult<()> {
        let mut caches = keep_caches.borrow_mut();
        let cache = caches.get_mut(&id).ok_or("unknown sequence")?;
        let kept: Vec<i32> = keep.iter().map(|&i| cache[num_past + i as usize]).collect();
        cache.truncate(num_past);
        cache.extend(kept);
        *keep_count.borrow_mut() += 1;
        Ok(())
    };
    let options = BatchEngineOptions { keep: Some(Box::new(keep)), num_drafters: 1, arms: Some(vec![Arm { drafter: Some(0), draft_len: 9 }]), policy: Policy::Fixed(0), ..Default::default() };
    let mut batch = ctx.batch_engine(&head, forward, options).unwrap();
    for id in 0..2u64 {
        let drafter = ctx.tree_drafter(decoy_tree, &CallbackDrafterOptions::default()).unwrap();
        batch.add_sequence(id, &PROMPT, vec![drafter], &GenerateOptions { temperature: 0.0, max_tokens: 20 + id as i32, ..Default::default() }).unwrap();
    }
    while batch.step().unwrap() > 0 {}
    for id in 0..2u64 {
        assert_eq!(batch.sequence(id).unwrap().tokens, greedy(20 + id as usize));
    }
    assert!(*keeps.borrow() > 0);
}
