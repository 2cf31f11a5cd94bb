//! The batched engine from Rust, against the single engine on a synthetic
//! target (a fixed random LM head; the hidden row after a context is a
//! fixed random embedding of its last token): each sequence emits what a
//! fresh `Engine::generate` emits (T = 0 and T > 0), a failing or
//! panicking per-sequence callback ends only that sequence, a failing
//! forward fails the step which a later step repeats, and bad input.
use std::cell::RefCell;
use std::collections::HashMap;
use std::error::Error as _;
use std::rc::Rc;

use flashspec::{sys, Arm, BatchEngine, BatchEngineOptions, BatchForward, CallbackDrafterOptions, CallbackPanic, Context, ContextOptions, Backend, DraftLenRule, Drafter, EngineOptions, FinishReason, GenerateOptions, NgramOptions, Policy, SuffixOptions};

const V: usize = 48;
const D: usize = 16;

fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            let mut s = 0.0;
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                s += (x >> 11) as f64 / (1u64 << 53) as f64;
            }
            ((s - 2.0) * 1.7) as f32
        })
        .collect()
}

/// The target model and one "KV cache" of tokens per sequence, checking
/// the ragged forward's num_past bookkeeping.
struct Host {
    w: Vec<f32>,
    e: Vec<f32>,
    caches: HashMap<u64, Vec<i32>>,
    forwards: usize,
    /// The forward call (0-based) that fails, if any.
    fail_forward_at: Option<usize>,
    batch_sizes: Vec<usize>,
}

type Shared = Rc<RefCell<Host>>;

fn host() -> Shared {
    Rc::new(RefCell::new(Host { w: values(11, V * D), e: values(12, V * D), caches: HashMap::new(), forwards: 0, fail_forward_at: None, batch_sizes: Vec::new() }))
}

fn rows_after(h: &Host, cache: &[i32], n: usize) -> Vec<f32> {
    cache[cache.len() - n..].iter().flat_map(|&t| h.e[t as usize * D..(t as usize + 1) * D].to_vec()).collect()
}

fn batch_forward(shared: &Shared) -> impl FnMut(&BatchForward<'_>) -> flashspec::CallbackResult<Vec<f32>> {
    let shared = shared.clone();
    move |call| {
        let mut h = shared.borrow_mut();
        let index = h.forwards;
        h.forwards += 1;
        if h.fail_forward_at == Some(index) {
            return Err("the target is down".into());
        }
        assert_eq!((call.token_offsets[0], call.row_offsets[0]), (0, 0));
        h.batch_sizes.push(call.num_sequences());
        let mut rows = Vec::with_capacity(call.num_rows() * D);
        for s in 0..call.num_sequences() {
            let mut cache = h.caches.remove(&call.sequence_ids[s]).unwrap_or_default();
            let past = call.num_past[s] as usize;
            if past > cache.len() {
                return Err(format!("num_past {past} beyond a cache of {}", cache.len()).into());
            }
            cache.truncate(past);
            cache.extend_from_slice(call.tokens_of(s));
            rows.extend(rows_after(&h, &cache, call.rows_of(s)));
            h.caches.insert(call.sequence_ids[s], cache);
        }
        Ok(rows)
    }
}

fn batch_rollback(shared: &Shared) -> Box<dyn FnMut(u64, usize) -> flashspec::CallbackResult<()>> {
    let shared = shared.clone();
    Box::new(move |id, keep| {
        let mut h = shared.borrow_mut();
        let cache = h.caches.get_mut(&id).ok_or("rollback of an unknown sequence")?;
        if keep > cache.len() {
            return Err(format!("rollback to {keep} beyond a cache of {}", cache.len()).into());
        }
        cache.truncate(keep);
        Ok(())
    })
}

fn context() -> Context {
    Context::new(&ContextOptions { backend: Backend::Cpu, seed: 5, cpu_threads: 2, max_rows: 64, max_requests: 8, ..Default::default() }).unwrap()
}

/// A drafter proposing xorshift noise (mostly rejected), failing once the
/// context reaches `fail_at` tokens.
fn noise_drafter(ctx: &Context, seed: u64, fail_at: Option<usize>) -> Drafter<'_> {
    let mut x = seed | 1;
    ctx.callback_drafter(
        move |context, k| {
            if fail_at.is_some_and(|n| context.len() >= n) {
                return Err("the draft model is down".into());
            }
            Ok((0..k)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % V as u64) as i32
                })
                .collect())
        },
        &CallbackDrafterOptions::default(),
    )
    .unwrap()
}

/// Each sequence's drafters: an n-gram drafter and a noise drafter.
fn drafters(ctx: &Context, seed: u64, fail_at: Option<usize>) -> Vec<Drafter<'_>> {
    vec![ctx.ngram_drafter(&NgramOptions::default()).unwrap(), noise_drafter(ctx, seed, fail_at)]
}

const ARMS: [Arm; 3] = [Arm { drafter: Some(0), draft_len: 3 }, Arm { drafter: Some(1), draft_len: 2 }, Arm { drafter: None, draft_len: 0 }];

fn batch_options<'a>(shared: &Shared) -> BatchEngineOptions<'a> {
    BatchEngineOptions { rollback: Some(batch_rollback(shared)), num_drafters: 2, arms: Some(ARMS.to_vec()), ..Default::default() }
}

/// What a fresh single engine with the same arms and drafters emits.
fn single_engine_tokens(ctx: &Context, head: &flashspec::LmHead<'_>, prompt: &[i32], seed: u64, options: &GenerateOptions<'_>) -> Vec<i32> {
    let shared = host();
    let forward = {
        let shared = shared.clone();
        move |tokens: &[i32], num_past: usize, num_rows: usize| -> flashspec::CallbackResult<Vec<f32>> {
            let mut h = shared.borrow_mut();
            let mut cache = h.caches.remove(&0).unwrap_or_default();
            cache.truncate(num_past);
            cache.extend_from_slice(tokens);
            let rows = rows_after(&h, &cache, num_rows);
            h.caches.insert(0, cache);
            Ok(rows)
        }
    };
    let mut engine = ctx.engine(head, forward, EngineOptions { drafters: drafters(ctx, seed, None), arms: Some(ARMS.to_vec()), ..Default::default() }).unwrap();
    engine.generate(prompt, options).unwrap().tokens
}

const PROMPTS: [&[i32]; 3] = [&[3, 17, 5, 3, 17], &[40, 2, 40, 2, 40, 2], &[9]];

fn run_against_single_engine(temperature: f32) {
    let ctx = context();
    let shared = host();
    let head = ctx.lm_head(&shared.borrow().w.clone(), V, D).unwrap();
    let mut engine = ctx.batch_engine(&head, batch_forward(&shared), batch_options(&shared)).unwrap();
    let options: Vec<GenerateOptions<'static>> = (0..3).map(|i| GenerateOptions { temperature, seed: 7, request_id: i, max_tokens: 12 + 5 * i as i32, ..Default::default() }).collect();
    let streamed = Rc::new(RefCell::new(Vec::new()));
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let id = 100 + i as u64;
        if i == 1 {
            let sink = streamed.clone();
            engine.add_sequence_streaming(id, prompt, drafters(&ctx, i as u64, None), &options[i], move |t| {
                sink.borrow_mut().push(t);
                false
            }).unwrap();
        } else {
            engine.add_sequence(id, prompt, drafters(&ctx, i as u64, None), &options[i]).unwrap();
        }
    }
    assert_eq!(engine.sequence_ids(), &[100, 101, 102]);
    engine.run().unwrap();
    let mut total = 0;
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let state = engine.sequence(100 + i as u64).unwrap();
        assert!(!state.active && state.error.is_none(), "{state:?}");
        assert_eq!(state.finish_reason, FinishReason::Length);
        assert_eq!(state.tokens, single_engine_tokens(&ctx, &head, prompt, i as u64, &options[i]), "sequence {i} at T = {temperature}");
        assert_eq!(engine.sequence_metrics(100 + i as u64).unwrap().emitted_tokens, state.tokens.len() as u64);
        total += state.tokens.len();
    }
    assert_eq!(*streamed.borrow(), engine.sequence(101).unwrap().tokens);
    // One forward per step for all active sequences.
    assert!(shared.borrow().batch_sizes.iter().any(|&n| n == 3));
    let m = engine.metrics().unwrap();
    assert_eq!(m.emitted_tokens, total as u64);
    assert_eq!(m.arms.len(), ARMS.len());
    assert_eq!(m.arms.iter().map(|a| a.pulls).sum::<u64>(), m.steps);
    assert!(m.position_drafted.is_empty());
}

#[test]
fn each_sequence_equals_the_single_engine_at_t0() {
    run_against_single_engine(0.0);
}

#[test]
fn each_sequence_equals_the_single_engine_at_t_above_0() {
    run_against_single_engine(0.9);
}

#[test]
fn t0_sequences_emit_greedy_decoding() {
    let ctx = context();
    let shared = host();
    let head = ctx.lm_head(&shared.borrow().w.clone(), V, D).unwrap();
    let mut engine = ctx.batch_engine(&head, batch_forward(&shared), batch_options(&shared)).unwrap();
    let options = GenerateOptions { temperature: 0.0, max_tokens: 10, ..Default::default() };
    engine.add_sequence(1, PROMPTS[0], drafters(&ctx, 1, None), &options).unwrap();
    engine.run().unwrap();
    let h = shared.borrow();
    let mut last = *PROMPTS[0].last().unwrap() as usize;
    let mut greedy = Vec::new();
    for _ in 0..10 {
        let scores: Vec<f64> = (0..V).map(|v| (0..D).map(|k| h.e[last * D + k] as f64 * h.w[v * D + k] as f64).sum()).collect();
        let mut order: Vec<usize> = (0..V).collect();
        order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap());
        assert!(scores[order[0]] - scores[order[1]] > 1e-3, "near-tie in the reference");
        last = order[0];
        greedy.push(last as i32);
    }
    assert_eq!(engine.sequence(1).unwrap().tokens, greedy);
}

#[test]
fn a_failing_sequence_callback_ends_only_that_sequence() {
    let ctx = context();
    let shared = host();
    let head = ctx.lm_head(&shared.borrow().w.clone(), V, D).unwrap();
    // The noise drafter is the only arm, so the failing one is asked every step.
    let options_of = |shared: &Shared| BatchEngineOptions { rollback: Some(batch_rollback(shared)), num_drafters: 2, arms: Some(vec![Arm { drafter: Some(1), draft_len: 2 }]), ..Default::default() };
    let mut engine = ctx.batch_engine(&head, batch_forward(&shared), options_of(&shared)).unwrap();
    let options = GenerateOptions { temperature: 0.0, max_tokens: 12, ..Default::default() };
    engine.add_sequence(1, PROMPTS[0], drafters(&ctx, 1, None), &options).unwrap();
    engine.add_sequence(2, PROMPTS[1], drafters(&ctx, 2, Some(PROMPTS[1].len() + 3)), &options).unwrap();
    engine.add_sequence_streaming(3, PROMPTS[2], drafters(&ctx, 3, None), &options, |t| {
        if t >= 0 {
            panic!("the token sink broke");
        }
        false
    }).unwrap();
    engine.run().unwrap();

    let ok = engine.sequence(1).unwrap();
    assert!(ok.error.is_none() && ok.finish_reason == FinishReason::Length && ok.tokens.len() == 12, "{ok:?}");

    let failed = engine.sequence(2).unwrap();
    assert!(!failed.active && failed.finish_reason == FinishReason::None, "{failed:?}");
    assert!(failed.tokens.len() >= 3 && failed.tokens.len() < 12, "{failed:?}");
    let error = failed.error.unwrap();
    assert_eq!(error.error.status, sys::FLASHSPEC_ERR_CALLBACK);
    assert_eq!(error.callback.as_ref().unwrap().0, "draft callback");
    assert_eq!(error.source().unwrap().to_string(), "the draft model is down");

    let panicked = engine.sequence(3).unwrap();
    assert_eq!(panicked.tokens.len(), 1, "{panicked:?}");
    assert_eq!(panicked.finish_reason, FinishReason::None);
    let error = panicked.error.unwrap();
    assert_eq!(error.error.status, sys::FLASHSPEC_ERR_CALLBACK);
    assert!(error.source().unwrap().downcast_ref::<CallbackPanic>().is_some_and(|p| p.0 == "the token sink broke"));

    // The tokens before the failure are the greedy ones.
    let single = single_engine_tokens(&ctx, &head, PROMPTS[1], 2, &options);
    assert_eq!(failed.tokens[..], single[..failed.tokens.len()]);
}

#[test]
fn a_failing_forward_fails_the_step_which_is_repeated() {
    let ctx = context();
    let shared = host();
    shared.borrow_mut().fail_forward_at = Some(2);
    let head = ctx.lm_head(&shared.borrow().w.clone(), V, D).unwrap();
    let mut engine = ctx.batch_engine(&head, batch_forward(&shared), batch_options(&shared)).unwrap();
    let options = GenerateOptions { temperature: 0.7, seed: 3, max_tokens: 10, ..Default::default() };
    engine.add_sequence(5, PROMPTS[0], drafters(&ctx, 5, None), &options).unwrap();
    assert_eq!(engine.step().unwrap(), 1);
    assert_eq!(engine.step().unwrap(), 1);
    let before = engine.sequence(5).unwrap();
    let err = engine.step().unwrap_err();
    assert_eq!(err.status(), sys::FLASHSPEC_ERR_CALLBACK);
    assert_eq!(err.callback.as_ref().unwrap().0, "target forward");
    assert_eq!(err.source().unwrap().to_string(), "the target is down");
    let after = engine.sequence(5).unwrap();
    assert_eq!((after.tokens, after.steps, after.active), (before.tokens, before.steps, true));
    engine.run().unwrap();
    assert_eq!(engine.sequence(5).unwrap().tokens, single_engine_tokens(&ctx, &head, PROMPTS[0], 5, &options));
}

#[test]
fn removing_a_sequence_hands_back_its_drafters() {
    let ctx = context();
    let shared = host();
    let head = ctx.lm_head(&shared.borrow().w.clone(), V, D).unwrap();
    let options = BatchEngineOptions { num_drafters: 1, draft_len_rule: DraftLenRule::Adaptive, ..Default::default() };
    let mut engine = ctx.batch_engine(&head, batch_forward(&shared), options).unwrap();
    let greedy = GenerateOptions { temperature: 0.0, max_tokens: 8, ..Default::default() };
    engine.add_sequence(1, PROMPTS[1], vec![ctx.suffix_drafter(&SuffixOptions::default()).unwrap()], &greedy).unwrap();
    engine.step().unwrap();
    let mut back = engine.remove_sequence(1).unwrap();
    assert_eq!(back.len(), 1);
    assert!(engine.sequence_ids().is_empty());
    assert_eq!(engine.sequence(1).unwrap_err().status, sys::FLASHSPEC_ERR_OUT_OF_RANGE);
    // The engine released it: it serves the next sequence.
    engine.add_sequence(2, PROMPTS[1], back.drain(..).collect(), &greedy).unwrap();
    engine.run().unwrap();
    assert_eq!(engine.sequence(2).unwrap().tokens.len(), 8);
}

#[test]
fn bad_input() {
    let ctx = context();
    let shared = host();
    let head = ctx.lm_head(&shared.borrow().w.clone(), V, D).unwrap();
    let options = GenerateOptions::default();

    let status = |r: flashspec::Result<BatchEngine<'_>>| r.err().map(|e| e.status);
    let bad_memory = BatchEngineOptions { draft_len_memory: 0.5, ..Default::default() };
    assert_eq!(status(ctx.batch_engine(&head, batch_forward(&shared), bad_memory)), Some(sys::FLASHSPEC_ERR_INVALID_ARGUMENT));
    let bad_arm = BatchEngineOptions { num_drafters: 1, arms: Some(vec![Arm { drafter: Some(1), draft_len: 2 }]), ..Default::default() };
    assert_eq!(status(ctx.batch_engine(&head, batch_forward(&shared), bad_arm)), Some(sys::FLASHSPEC_ERR_OUT_OF_RANGE));
    let short_oracle = BatchEngineOptions { num_drafters: 2, policy: Policy::Oracle(vec![1.0]), ..Default::default() };
    let err = ctx.batch_engine(&head, batch_forward(&shared), short_oracle).err().unwrap();
    assert_eq!((err.status, err.message.as_str()), (sys::FLASHSPEC_ERR_OUT_OF_RANGE, "oracle rewards: 1 entries for 2 arms"));

    let mut engine = ctx.batch_engine(&head, batch_forward(&shared), BatchEngineOptions { num_drafters: 2, max_sequences: 2, ..Default::default() }).unwrap();
    let refused = |r: flashspec::Result<()>, want: sys::flashspec_status, name: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.status, want, "{e}");
        assert!(e.message.contains(name), "{e}");
    };
    refused(engine.add_sequence(1, &[], drafters(&ctx, 1, None), &options), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "prompt");
    refused(engine.add_sequence(1, &[V as i32], drafters(&ctx, 1, None), &options), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "prompt");
    refused(engine.add_sequence(1, &[1], vec![noise_drafter(&ctx, 1, None)], &options), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "num_drafters");
    refused(engine.add_sequence(1, &[1], drafters(&ctx, 1, None), &GenerateOptions { temperature: -1.0, ..Default::default() }), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "temperature");
    refused(engine.add_sequence(1, &[1], drafters(&ctx, 1, None), &GenerateOptions { stop_tokens: &[-1], ..Default::default() }), sys::FLASHSPEC_ERR_OUT_OF_RANGE, "stop");
    let logits = ctx.logits_drafter(|_, _| Ok((vec![], vec![])), &CallbackDrafterOptions::default()).unwrap();
    refused(engine.add_sequence(1, &[1], vec![logits, noise_drafter(&ctx, 1, None)], &options), sys::FLASHSPEC_ERR_UNSUPPORTED, "");
    // Nothing was added by the refusals.
    assert!(engine.sequence_ids().is_empty());
    assert_eq!(engine.step().unwrap(), 0);

    engine.add_sequence(1, &[1], drafters(&ctx, 1, None), &options).unwrap();
    refused(engine.add_sequence(1, &[1], drafters(&ctx, 2, None), &options), sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "sequence_id");
    engine.add_sequence(2, &[1], drafters(&ctx, 2, None), &options).unwrap();
    refused(engine.add_sequence(3, &[1], drafters(&ctx, 3, None), &options), sys::FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "");
    assert_eq!(engine.sequence_ids(), &[1, 2]);
    assert_eq!(engine.remove_sequence(9).err().unwrap().status, sys::FLASHSPEC_ERR_OUT_OF_RANGE);
    assert_eq!(engine.sequence_metrics(9).unwrap_err().status, sys::FLASHSPEC_ERR_OUT_OF_RANGE);

    // A forward returning the wrong number of values fails the step.
    let mut wrong = ctx.batch_engine(&head, |_: &BatchForward<'_>| Ok(vec![0.0; D + 1]), BatchEngineOptions::default()).unwrap();
    wrong.add_sequence(1, &[1, 2], vec![], &options).unwrap();
    let err = wrong.step().unwrap_err();
    assert_eq!(err.status(), sys::FLASHSPEC_ERR_CALLBACK);
    assert!(err.source().unwrap().to_string().contains("not num_rows × d"), "{err}");
    assert!(wrong.sequence(1).unwrap().tokens.is_empty());
}
