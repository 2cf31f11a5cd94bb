//! The speculative engine from Rust: a synthetic target model (a fixed
//! random LM head; the hidden row after a context is a fixed random
//! embedding of its last token), greedy decoding computed here as the
//! reference, drafters good and bad, failing and panicking closures,
//! cancellation and metrics.
use std::cell::RefCell;
use std::error::Error as _;
use std::rc::Rc;
use std::sync::mpsc;

use flashspec::{sys, Arm, CallbackDrafterOptions, CallbackPanic, Context, ContextOptions, Backend, Engine, EngineMetrics, EngineOptions, FinishReason, GenerateOptions, NgramOptions, Policy};

const V: usize = 48;
const D: usize = 16;
const PROMPT: [i32; 5] = [3, 17, 5, 3, 17];

/// Deterministic pseudo-normal values (no crates).
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

/// The target: W and E, and a "KV cache" of tokens that checks the engine's
/// num_past / rollback bookkeeping.
struct Model {
    w: Vec<f32>,
    e: Vec<f32>,
    cache: Vec<i32>,
    rollbacks: usize,
}

type Shared = Rc<RefCell<Model>>;

fn model() -> Shared {
    Rc::new(RefCell::new(Model { w: values(11, V * D), e: values(12, V * D), cache: Vec::new(), rollbacks: 0 }))
}

fn forward(m: &Shared) -> impl FnMut(&[i32], usize, usize) -> flashspec::CallbackResult<Vec<f32>> {
    let m = m.clone();
    move |tokens, num_past, num_rows| {
        let mut m = m.borrow_mut();
        if num_past > m.cache.len() || num_rows == 0 || num_rows > tokens.len() {
            return Err(format!("num_past {num_past}, num_rows {num_rows} with a cache of {}", m.cache.len()).into());
        }
        m.cache.truncate(num_past);
        m.cache.extend_from_slice(tokens);
        let rows = m.cache[m.cache.len() - num_rows..].iter().flat_map(|&t| m.e[t as usize * D..(t as usize + 1) * D].to_vec()).collect();
        Ok(rows)
    }
}

fn rollback(m: &Shared) -> Box<dyn FnMut(usize) -> flashspec::CallbackResult<()>> {
    let m = m.clone();
    Box::new(move |num_keep| {
        let mut m = m.borrow_mut();
        if num_keep > m.cache.len() {
            return Err(format!("rollback to {num_keep} beyond the cache of {}", m.cache.len()).into());
        }
        m.rollbacks += 1;
        m.cache.truncate(num_keep);
        Ok(())
    })
}

/// Plain greedy decoding in f64; panics on a near-tie, where fp32
/// accumulation could flip a token.
fn greedy(m: &Shared, n: usize) -> Vec<i32> {
    let m = m.borrow();
    let mut last = *PROMPT.last().unwrap() as usize;
    let mut out = Vec::new();
    for _ in 0..n {
        let scores: Vec<f64> = (0..V).map(|v| (0..D).map(|k| m.e[last * D + k] as f64 * m.w[v * D + k] as f64).sum()).collect();
        let mut order: Vec<usize> = (0..V).collect();
        order.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap());
        assert!(scores[order[0]] - scores[order[1]] > 1e-3, "near-tie in the reference: pick another seed");
        last = order[0];
        out.push(last as i32);
    }
    out
}

fn context() -> Context {
    Context::new(&ContextOptions { backend: Backend::Cpu, seed: 5, cpu_threads: 2, max_rows: 32, ..Default::default() }).unwrap()
}

/// A tiny xorshift for drafters that propose noise.
fn noise(seed: u64) -> impl FnMut(&[i32], usize) -> flashspec::CallbackResult<Vec<i32>> {
    let mut x = seed | 1;
    move |_, k| {
        Ok((0..k)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % V as u64) as i32
            })
            .collect())
    }
}

fn check_metrics(m: &EngineMetrics, emitted: usize) {
    assert_eq!(m.emitted_tokens, emitted as u64);
    assert!(m.accepted_tokens <= m.draft_tokens);
    assert_eq!(m.position_drafted.iter().sum::<u64>(), m.draft_tokens);
    assert_eq!(m.position_accepted.iter().sum::<u64>(), m.accepted_tokens);
    assert_eq!(m.position_drafted.first().copied().unwrap_or(0), m.drafts);
    for j in 0..m.position_drafted.len() {
        assert!(m.position_accepted[j] <= m.position_drafted[j]);
        if j > 0 {
            assert!(m.position_drafted[j] <= m.position_drafted[j - 1] && m.position_accepted[j] <= m.position_accepted[j - 1]);
        }
    }
    assert_eq!(m.arms.iter().map(|a| a.pulls).sum::<u64>(), m.steps);
    assert_eq!(m.arms.iter().map(|a| a.draft_tokens).sum::<u64>(), m.draft_tokens);
    assert_eq!(m.arms.iter().map(|a| a.accepted_tokens).sum::<u64>(), m.accepted_tokens);
    assert!(m.steps > 0 && (m.tokens_per_step - m.emitted_tokens as f64 / m.steps as f64).abs() < 1e-12);
    assert!(m.step_latency_p50_us > 0.0 && m.step_latency_p99_us >= m.step_latency_p50_us);
}

fn greedy_options(max_tokens: i32) -> GenerateOptions<'static> {
    GenerateOptions { temperature: 0.0, seed: 9, max_tokens, ..Default::default() }
}

#[test]
fn greedy_generation_equals_greedy_decoding() {
    let ctx = context();
    let m = model();
    let head = ctx.lm_head(&m.borrow().w.clone(), V, D).unwrap();
    let ngram = ctx.ngram_drafter(&NgramOptions { min_n: 1, max_n: 3, ..Default::default() }).unwrap();
    let random = ctx.callback_drafter(noise(4), &CallbackDrafterOptions::default()).unwrap();
    let options = EngineOptions {
        rollback: Some(rollback(&m)),
        drafters: vec![ngram, random],
        arms: Some(vec![Arm { drafter: Some(0), draft_len: 2 }, Arm { drafter: Some(0), draft_len: 6 }, Arm { drafter: Some(1), draft_len: 3 }, Arm { drafter: None, draft_len: 0 }]),
        target_row_cost: 0.05,
        ..Default::default()
    };
    let mut engine = ctx.engine(&head, forward(&m), options).unwrap();
    let mut streamed = Vec::new();
    let g = engine.generate_streaming(&PROMPT, &greedy_options(60), |t| {
        streamed.push(t);
        false
    }).unwrap();
    let want = greedy(&m, 60);
    assert_eq!(g.tokens, want);
    assert_eq!(streamed, want);
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert!(m.borrow().rollbacks > 0, "the random drafter never had a draft rejected");
    let metrics = engine.metrics().unwrap();
    check_metrics(&metrics, 60);
    assert_eq!(metrics.steps, g.steps as u64);
    assert!(metrics.steps < 60);
    assert_eq!(metrics.arms.iter().map(|a| (a.drafter, a.draft_len)).collect::<Vec<_>>(), vec![(Some(0), 2), (Some(0), 6), (Some(1), 3), (None, 0)]);
    engine.reset_metrics().unwrap();
    assert_eq!(engine.metrics().unwrap().steps, 0);
    assert_eq!(engine.generate(&PROMPT, &greedy_options(60)).unwrap().tokens, want);
}

#[test]
fn a_perfect_drafter_and_a_logits_drafter() {
    let ctx = context();
    let m = model();
    let head = ctx.lm_head(&m.borrow().w.clone(), V, D).unwrap();
    let want = greedy(&m, 40);
    let reference = want.clone();
    let oracle = ctx.callback_drafter(move |context, k| {
        let done = context.len() - PROMPT.len();
        Ok(reference[done..(done + k).min(reference.len())].to_vec())
    }, &CallbackDrafterOptions::default()).unwrap();
    let mut engine = ctx.engine(&head, forward(&m), EngineOptions { drafters: vec![oracle], default_draft_len: 4, policy: Policy::Fixed(0), ..Default::default() }).unwrap();
    let g = engine.generate(&PROMPT, &greedy_options(40)).unwrap();
    assert_eq!(g.tokens, want);
    let metrics = engine.metrics().unwrap();
    check_metrics(&metrics, 40);
    assert_eq!((metrics.acceptance_rate, metrics.steps), (1.0, 8));
    assert_eq!(metrics.position_acceptance(), vec![1.0; 4]);
    drop(engine);

    // Tokens sampled from the drafter's own (wrong) logits: still exact, so
    // greedy at T = 0; at T > 0 the same seed gives the same tokens.
    let sampler = |seed: u64| {
        let mut draw = noise(seed);
        move |_: &[i32], k: usize| -> flashspec::CallbackResult<(Vec<i32>, Vec<f32>)> {
            let k = k.min(3);
            Ok((draw(&[], k)?, values(seed + k as u64, k * V)))
        }
    };
    let options = CallbackDrafterOptions { draft_temperature: 0.7, ..Default::default() };
    let mut engine = ctx.engine(&head, forward(&m), EngineOptions { rollback: Some(rollback(&m)), drafters: vec![ctx.logits_drafter(sampler(8), &options).unwrap()], ..Default::default() }).unwrap();
    assert_eq!(engine.generate(&PROMPT, &greedy_options(30)).unwrap().tokens, want[..30]);
    assert!(engine.metrics().unwrap().draft_tokens > 0);
    let sampled = GenerateOptions { temperature: 0.8, seed: 77, max_tokens: 25, ..Default::default() };
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let mut e = ctx.engine(&head, forward(&m), EngineOptions { drafters: vec![ctx.logits_drafter(sampler(2), &options).unwrap()], ..Default::default() }).unwrap();
            e.generate(&PROMPT, &sampled).unwrap()
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
    assert_eq!(runs[0].tokens.len(), 25);
}

#[derive(Debug)]
struct Boom(&'static str);

impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} exploded", self.0)
    }
}

impl std::error::Error for Boom {}

#[test]
fn failing_and_panicking_callbacks_fail_the_call_and_the_engine_stays_usable() {
    for (where_, panics) in [("target forward", false), ("target rollback", false), ("draft callback", false), ("token callback", false), ("target forward", true), ("draft callback", true), ("token callback", true)] {
        let ctx = context();
        let m = model();
        let head = ctx.lm_head(&m.borrow().w.clone(), V, D).unwrap();
        let want = greedy(&m, 30);
        let armed = Rc::new(RefCell::new((true, 0usize)));
        let fail = {
            let armed = armed.clone();
            move |name: &'static str| -> flashspec::CallbackResult<()> {
                let mut a = armed.borrow_mut();
                if a.0 && name == where_ {
                    a.1 += 1;
                    if a.1 == 3 {
                        if panics {
                            panic!("{name} panicked");
                        }
                        return Err(Box::new(Boom(name)));
                    }
                }
                Ok(())
            }
        };
        let (f1, f2, f3, f4) = (fail.clone(), fail.clone(), fail.clone(), fail);
        let mut draw = noise(2);
        let drafter = ctx.callback_drafter(move |c, k| {
            f1("draft callback")?;
            draw(c, k)
        }, &CallbackDrafterOptions::default()).unwrap();
        let mut inner_forward = forward(&m);
        let mut inner_rollback = rollback(&m);
        let options = EngineOptions {
            rollback: Some(Box::new(move |keep| {
                f2("target rollback")?;
                inner_rollback(keep)
            })),
            drafters: vec![drafter],
            ..Default::default()
        };
        let mut engine = ctx.engine(&head, move |t, p, r| {
            f3("target forward")?;
            inner_forward(t, p, r)
        }, options).unwrap();
        let on_token = |_| {
            if let Err(e) = f4("token callback") {
                panic!("{e}");
            }
            false
        };
        let e = engine.generate_streaming(&PROMPT, &greedy_options(30), on_token).unwrap_err();
        assert_eq!(e.status(), sys::FLASHSPEC_ERR_CALLBACK, "{where_}: {e}");
        assert_eq!(e.callback.as_ref().unwrap().0, where_);
        assert!(e.error.message.contains(where_), "{}", e.error.message);
        let source = e.source().expect("the callback's error");
        if panics || where_ == "token callback" {
            assert!(source.downcast_ref::<CallbackPanic>().is_some(), "{where_}: {source}");
        } else {
            assert_eq!(source.downcast_ref::<Boom>().unwrap().0, where_);
        }
        assert_eq!(e.tokens, want[..e.tokens.len()]);
        armed.borrow_mut().0 = false;
        let g = engine.generate_streaming(&PROMPT, &greedy_options(30), on_token).unwrap();
        assert_eq!((g.tokens, g.finish_reason), (want, FinishReason::Length), "{where_} after the failure");
    }
}

#[test]
fn stops_and_cancellation() {
    let ctx = context();
    let m = model();
    let head = ctx.lm_head(&m.borrow().w.clone(), V, D).unwrap();
    let want = greedy(&m, 40);
    let ngram = ctx.ngram_drafter(&NgramOptions::default()).unwrap();
    let mut engine = ctx.engine(&head, forward(&m), EngineOptions { rollback: Some(rollback(&m)), drafters: vec![ngram], ..Default::default() }).unwrap();
    let index = |t: i32| want.iter().position(|&x| x == t).unwrap();

    let stop = [want[7]];
    let g = engine.generate(&PROMPT, &GenerateOptions { stop_tokens: &stop, ..greedy_options(40) }).unwrap();
    assert_eq!(g.finish_reason, FinishReason::StopToken);
    assert_eq!(g.tokens, want[..=index(want[7])]);

    let g = engine.generate_streaming(&PROMPT, &greedy_options(40), |t| t == want[4]).unwrap();
    assert_eq!(g.finish_reason, FinishReason::HostStop);
    assert_eq!(g.tokens, want[..=index(want[4])]);

    let canceller = engine.canceller();
    let mut seen = 0;
    let e = engine.generate_streaming(&PROMPT, &greedy_options(40), |_| {
        seen += 1;
        if seen == 3 {
            canceller.cancel();
        }
        false
    }).unwrap_err();
    assert_eq!(e.status(), sys::FLASHSPEC_ERR_CANCELLED);
    assert_eq!(e.finish_reason, FinishReason::Cancelled);
    assert!(e.tokens.len() >= 3 && e.tokens == want[..e.tokens.len()]);
    assert_eq!(engine.generate(&PROMPT, &greedy_options(40)).unwrap().tokens, want);

    // From another thread, while the target forward blocks.
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let mut inner = forward(&m);
    let mut slow = ctx.engine(&head, move |t, p, r| {
        let _ = started_tx.send(());
        let _ = release_rx.recv();
        inner(t, p, r)
    }, EngineOptions::default()).unwrap();
    let canceller = slow.canceller();
    let helper = std::thread::spawn(move || {
        started_rx.recv().unwrap();
        canceller.cancel();
        drop(release_tx);
    });
    let e = slow.generate(&PROMPT, &greedy_options(1000)).unwrap_err();
    helper.join().unwrap();
    assert_eq!(e.status(), sys::FLASHSPEC_ERR_CANCELLED);
    assert!(!e.tokens.is_empty() && e.tokens.len() < 1000);
    // A canceller outliving its engine is a no-op.
    let late = slow.canceller();
    drop(slow);
    late.cancel();
}

#[test]
fn bad_input_is_an_error() {
    let ctx = context();
    let m = model();
    let head = ctx.lm_head(&m.borrow().w.clone(), V, D).unwrap();
    let mut engine: Engine<'_> = ctx.engine(&head, forward(&m), EngineOptions::default()).unwrap();
    let e = engine.generate(&[V as i32], &greedy_options(4)).unwrap_err();
    assert_eq!(e.status(), sys::FLASHSPEC_ERR_OUT_OF_RANGE);
    assert!(e.error.message.contains("prompt"), "{}", e.error.message);
    let e = engine.generate(&PROMPT, &GenerateOptions { temperature: -1.0, ..Default::default() }).unwrap_err();
    assert_eq!(e.status(), sys::FLASHSPEC_ERR_INVALID_ARGUMENT);
    let mut wide = ctx.engine(&head, |_, _, rows| Ok(vec![0.0; rows * (D + 1)]), EngineOptions::default()).unwrap();
    let e = wide.generate(&PROMPT, &greedy_options(4)).unwrap_err();
    assert_eq!(e.status(), sys::FLASHSPEC_ERR_CALLBACK);
    let mut nan = ctx.engine(&head, |_, _, rows| Ok(vec![f32::NAN; rows * D]), EngineOptions::default()).unwrap();
    assert_eq!(nan.generate(&PROMPT, &greedy_options(4)).unwrap_err().status(), sys::FLASHSPEC_ERR_NON_FINITE);
    let e = ctx.ngram_drafter(&NgramOptions { min_n: 5, max_n: 2, ..Default::default() }).err().unwrap();
    assert_eq!(e.status, sys::FLASHSPEC_ERR_OUT_OF_RANGE);
    let e = ctx.engine(&head, forward(&m), EngineOptions { policy: Policy::Oracle(vec![]), ..Default::default() }).err().unwrap();
    assert_eq!(e.status, sys::FLASHSPEC_ERR_NULL_POINTER);
    assert!(e.message.contains("oracle_rewards"), "{}", e.message);
    let two_arms = Some(vec![Arm { drafter: None, draft_len: 0 }, Arm { drafter: None, draft_len: 0 }]);
    let e = ctx.engine(&head, forward(&m), EngineOptions { arms: two_arms, policy: Policy::Oracle(vec![1.0]), ..Default::default() }).err().unwrap();
    assert_eq!(e.status, sys::FLASHSPEC_ERR_OUT_OF_RANGE);
    assert!(e.message.contains("oracle rewards: 1 entries for 2 arms"), "{}", e.message);
    let e = ctx.engine(&head, forward(&m), EngineOptions { arms: Some(vec![Arm { drafter: Some(0), draft_len: 2 }]), ..Default::default() }).err().unwrap();
    assert_eq!(e.status, sys::FLASHSPEC_ERR_OUT_OF_RANGE);
    let mut thompson = ctx.engine(&head, forward(&m), EngineOptions { drafters: vec![ctx.ngram_drafter(&NgramOptions::default()).unwrap()], policy: Policy::Thompson { seed: 3 }, ..Default::default() }).unwrap();
    assert_eq!(thompson.generate(&PROMPT, &greedy_options(20)).unwrap().tokens, greedy(&m, 20));
}
