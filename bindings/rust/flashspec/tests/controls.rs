//! Sampling controls and logprobs through the safe crate, on the CPU
//! backend: results against float64 references, and every slice checked
//! against the batch before the library is called.
use flashspec::{pack_token_mask, sys, Context, DraftOptions, LogitBias, LogitBiasBuf, SamplingControls, TokenMask, VerifyBatch, MAX_TOP_LOGPROBS, TOP_K_ALL};

const V: usize = 30;
const D: usize = 8;

/// Deterministic pseudo-random values (no crates).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f32 {
        ((0..4).map(|_| self.uniform()).sum::<f64>() - 2.0) as f32 * 1.7
    }
    fn values(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }
    /// `[rows, V]` allowed flags, each row allowing a token.
    fn allowed(&mut self, rows: usize) -> Vec<bool> {
        let mut a: Vec<bool> = (0..rows * V).map(|_| self.next() % 3 == 0).collect();
        for row in a.chunks_mut(V) {
            if !row.contains(&true) {
                row[0] = true;
            }
        }
        a
    }
}

fn logits(w: &[f32], h: &[f32], row: usize) -> Vec<f64> {
    (0..V).map(|t| (0..D).map(|k| h[row * D + k] as f64 * w[t * D + k] as f64).sum()).collect()
}

fn log_softmax(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    x.iter().map(|v| v - lse).collect()
}

/// l + bias over the allowed tokens, -inf elsewhere.
fn biased(l: &[f64], allowed: &[bool], bias: &[(i32, f32)]) -> Vec<f64> {
    let mut x = l.to_vec();
    for &(t, b) in bias {
        x[t as usize] += b as f64;
    }
    x.iter().zip(allowed).map(|(&v, &ok)| if ok { v } else { f64::NEG_INFINITY }).collect()
}

/// First index of the largest value (ties: the smallest id).
fn argmax(v: &[f64]) -> usize {
    (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
}

/// Token ids by decreasing value, ties by smaller id.
fn by_value(v: &[f64]) -> Vec<i32> {
    let mut ids: Vec<usize> = (0..v.len()).collect();
    ids.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap().then(a.cmp(&b)));
    ids.into_iter().map(|i| i as i32).collect()
}

fn fixture(seed: u64) -> (Context, Vec<f32>) {
    (Context::cpu(seed).unwrap(), Rng(seed * 7 + 1).values(V * D))
}

#[test]
fn temperature_zero_verify_is_greedy_over_the_controlled_set() {
    let (ctx, w) = fixture(1);
    let head = ctx.lm_head(&w, V, D).unwrap();
    let mut rng = Rng(21);
    const R: usize = 3;
    const N: usize = 3;
    const TOP: usize = 4;
    let rows = R * (N + 1);
    let hidden = rng.values(rows * D);
    let allowed = rng.allowed(rows);
    // Request r's bias; a token named twice gets the sum.
    let bias: Vec<Vec<(i32, f32)>> = (0..R).map(|_| vec![((rng.next() % V as u64) as i32, 1.5), ((rng.next() % V as u64) as i32, -2.0), (7, 1.0), (7, 1.0)]).collect();
    let greedy: Vec<i32> = (0..rows).map(|row| argmax(&biased(&logits(&w, &hidden, row), &allowed[row * V..][..V], &bias[row / (N + 1)])) as i32).collect();
    // Request r drafts the controlled argmax, but a wrong token at position r.
    let mut offsets = vec![0i32];
    let mut drafts = Vec::new();
    for r in 0..R {
        for j in 0..N {
            let token = greedy[r * (N + 1) + j];
            drafts.push(if j == r { (token + 1) % V as i32 } else { token });
        }
        offsets.push(drafts.len() as i32);
    }
    let mask = pack_token_mask(&allowed, V).unwrap();
    let bias_buf = LogitBiasBuf::from_requests(bias.iter().map(|b| b.iter().copied()));
    let controls = SamplingControls {
        top_k: Some(&[3, 1, TOP_K_ALL]),
        top_p: Some(&[0.5, 1.0, 0.9]),
        min_p: Some(&[0.5, 0.0, 1.0]),
        logit_bias: Some(bias_buf.as_bias()),
        token_mask: Some(TokenMask::new(&mask)),
        ..Default::default()
    };
    let batch = VerifyBatch { draft_offsets: &offsets, draft_tokens: &drafts, target_hidden: &hidden, temperatures: Some(&[0.0; R]), controls: Some(controls), logprobs: true, top_logprobs: TOP, ..Default::default() };
    let result = ctx.verify_and_finalize(&head, &batch).unwrap();
    assert_eq!((result.logprobs.len(), result.raw_logprobs.len(), result.top_tokens.len(), result.top_n), (rows, rows, rows * TOP, TOP));
    for r in 0..R {
        assert_eq!(result.accepted_counts[r] as usize, r);
        assert_eq!(result.tokens(r), &greedy[r * (N + 1)..][..r + 1], "request {r}");
        assert!(result.token_logprobs(r, false).unwrap().iter().all(|&lp| lp == 0.0), "T = 0 is a point mass");
        for k in 0..=N {
            let slot = r * (N + 1) + k;
            let (top, top_lp) = result.top(r, k);
            if k > r {
                assert_eq!(result.emitted_tokens[slot], -1);
                assert!(result.logprobs[slot].is_nan() && result.raw_logprobs[slot].is_nan());
                assert!(top.iter().all(|&t| t == -1) && top_lp.iter().all(|lp| lp.is_nan()));
                continue;
            }
            let l = logits(&w, &hidden, slot);
            let raw = log_softmax(&l);
            assert!((result.raw_logprobs[slot] as f64 - raw[greedy[slot] as usize]).abs() < 1e-4, "slot {slot}");
            // By raw logit: no bias, mask or truncation.
            assert_eq!(top, &by_value(&l)[..TOP], "slot {slot}");
            for (t, lp) in top.iter().zip(top_lp) {
                assert!((*lp as f64 - raw[*t as usize]).abs() < 1e-4);
            }
        }
    }
    let mut summaries = ctx.summaries(16, 4).unwrap();
    ctx.verify(&head, &batch, &mut summaries).unwrap();
    let again = ctx.finalize(&head, &batch, &summaries).unwrap();
    assert_eq!((again.emitted_tokens, again.top_tokens), (result.emitted_tokens.clone(), result.top_tokens.clone()));

    // A greedy draft under the same controls, per row, gives the same argmaxes.
    let row_bias = LogitBiasBuf::from_requests((0..rows).map(|row| bias[row / (N + 1)].iter().copied()));
    let options = DraftOptions { controls: Some(SamplingControls { logit_bias: Some(row_bias.as_bias()), token_mask: Some(TokenMask::new(&mask)), ..Default::default() }), ..Default::default() };
    let (tokens, _) = ctx.draft(&head, &hidden, &options).unwrap();
    assert_eq!(tokens, greedy);
}

#[test]
fn logprobs_are_those_of_the_controlled_distribution() {
    let (ctx, w) = fixture(2);
    let head = ctx.lm_head(&w, V, D).unwrap();
    let mut rng = Rng(22);
    const R: usize = 4;
    const N: usize = 2;
    const T: f64 = 0.7;
    let rows = R * (N + 1);
    let hidden = rng.values(rows * D);
    let allowed = rng.allowed(rows);
    let bias = [(5, 1.5f32), (9, -0.5)];
    let x = |row: usize| biased(&logits(&w, &hidden, row), &allowed[row * V..][..V], &bias);
    let drafts: Vec<i32> = (0..R).flat_map(|r| (0..N).map(move |j| r * (N + 1) + j)).map(|row| argmax(&x(row)) as i32).collect();
    let offsets: Vec<i32> = (0..=R).map(|r| (r * N) as i32).collect();
    let mask = pack_token_mask(&allowed, V).unwrap();
    let bias_buf = LogitBiasBuf::from_requests((0..R).map(|_| bias));
    let controls = SamplingControls { logit_bias: Some(bias_buf.as_bias()), token_mask: Some(TokenMask::new(&mask)), ..Default::default() };
    let batch = VerifyBatch { draft_offsets: &offsets, draft_tokens: &drafts, target_hidden: &hidden, temperatures: Some(&[T as f32; R]), controls: Some(controls), logprobs: true, ..Default::default() };
    let result = ctx.verify_and_finalize(&head, &batch).unwrap();
    assert!(result.top_tokens.is_empty() && result.top_n == 0);
    for r in 0..R {
        let logprobs = result.token_logprobs(r, false).unwrap();
        for (k, &token) in result.tokens(r).iter().enumerate() {
            let slot = r * (N + 1) + k;
            let p = log_softmax(&x(slot).iter().map(|v| v / T).collect::<Vec<_>>());
            assert!(p[token as usize].is_finite(), "slot {slot} emitted a masked token");
            assert!((logprobs[k] as f64 - p[token as usize]).abs() < 1e-4, "slot {slot}: {} vs {}", logprobs[k], p[token as usize]);
        }
    }
}

/// Two requests of 2 and 1 drafts (5 target rows) asking for logprobs.
fn b<'a>(hidden: &'a [f32], controls: SamplingControls<'a>) -> VerifyBatch<'a> {
    VerifyBatch { draft_offsets: &[0, 2, 3], draft_tokens: &[1, 2, 3], target_hidden: hidden, controls: Some(controls), logprobs: true, top_logprobs: 2, ..Default::default() }
}

#[test]
fn repetition_penalty_scales_the_logits_of_the_named_tokens() {
    // Each row's raw argmax and argmin, named with a bias of 0 and
    // penalised: l / r for l > 0, l · r otherwise. T = 0 gives the argmax of
    // the penalised logits.
    let (ctx, w) = fixture(5);
    let head = ctx.lm_head(&w, V, D).unwrap();
    const ROWS: usize = 12;
    let hidden = Rng(26).values(ROWS * D);
    let named: Vec<[i32; 2]> = (0..ROWS)
        .map(|r| {
            let l = logits(&w, &hidden, r);
            [argmax(&l) as i32, argmax(&l.iter().map(|v| -v).collect::<Vec<_>>()) as i32]
        })
        .collect();
    let penalty: Vec<f32> = (0..ROWS).map(|r| 1.5 + 3.5 * r as f32).collect();
    let bias = LogitBiasBuf::from_requests(named.iter().map(|n| n.map(|t| (t, 0.0))));
    let controls = SamplingControls { logit_bias: Some(bias.as_bias()), repetition_penalty: Some(&penalty), ..Default::default() };
    let (tokens, _) = ctx.draft(&head, &hidden, &DraftOptions { controls: Some(controls), ..Default::default() }).unwrap();
    let mut changed = 0;
    for r in 0..ROWS {
        let mut l = logits(&w, &hidden, r);
        for t in named[r] {
            let v = &mut l[t as usize];
            *v = if *v > 0.0 { *v / penalty[r] as f64 } else { *v * penalty[r] as f64 };
        }
        assert_eq!(tokens[r] as usize, argmax(&l), "row {r}");
        changed += usize::from(tokens[r] != named[r][0]);
    }
    assert!(changed > ROWS / 2, "the penalty moved {changed} of {ROWS} argmaxes");
}

fn refused_before_the_call(ctx: &Context, err: flashspec::Error, want: &str) {
    assert_eq!(err.status, sys::FLASHSPEC_ERR_OUT_OF_RANGE, "{err}");
    assert!(err.message.contains(want), "{err}, want {want}");
    assert_eq!(ctx.last_error(), "", "the library was called");
}

#[test]
fn control_slices_are_checked_against_the_batch() {
    let (ctx, w) = fixture(3);
    let head = ctx.lm_head(&w, V, D).unwrap();
    let hidden = Rng(23).values(5 * D); // two requests of 2 and 1 drafts: 5 target rows
    let mask = pack_token_mask(&[true; 5 * V], V).unwrap(); // 5 rows of 1 word
    let bias = LogitBiasBuf { offsets: vec![0, 1, 3], tokens: vec![1, 2, 3], values: vec![1.0, 1.0, 1.0] };
    let top_k = [5, 5, 5];
    let eps = [0.1f32, 0.1];
    let draft_logits = vec![0.0f32; 3 * V];
    let base = SamplingControls { top_k: Some(&top_k[..2]), logit_bias: Some(bias.as_bias()), token_mask: Some(TokenMask::new(&mask)), ..Default::default() };
    let cases: Vec<(&str, VerifyBatch<'_>)> = vec![
        // Each short slice is the start of a longer one: without the
        // check the library reads on past it.
        ("controls.top_k: 1 entries for 2 requests", b(&hidden, SamplingControls { top_k: Some(&top_k[..1]), ..base })),
        ("controls.top_p: 0 entries for 2 requests", b(&hidden, SamplingControls { top_p: Some(&[]), ..base })),
        ("controls.min_p: 1 entries for 2 requests", b(&hidden, SamplingControls { min_p: Some(&[0.1]), ..base })),
        ("controls.repetition_penalty: 1 entries for 2 requests", b(&hidden, SamplingControls { repetition_penalty: Some(&eps[..1]), ..base })),
        ("controls.typical_epsilon: 1 entries for 2 requests", b(&hidden, SamplingControls { typical_epsilon: Some(&eps[..1]), ..base })),
        ("controls.typical_delta: 1 entries for 2 requests", b(&hidden, SamplingControls { typical_epsilon: Some(&eps), typical_delta: Some(&eps[..1]), ..base })),
        ("controls.logit_bias.offsets: 2 entries for R + 1 = 3", b(&hidden, SamplingControls { logit_bias: Some(LogitBias { offsets: &bias.offsets[..2], ..bias.as_bias() }), ..base })),
        ("controls.logit_bias.tokens: 2 entries for offsets[R] = 3", b(&hidden, SamplingControls { logit_bias: Some(LogitBias { tokens: &bias.tokens[..2], ..bias.as_bias() }), ..base })),
        ("controls.logit_bias.values: 0 entries for offsets[R] = 3", b(&hidden, SamplingControls { logit_bias: Some(LogitBias { values: &[], ..bias.as_bias() }), ..base })),
        ("controls.token_mask: 4 words for 5 rows of 1 words", b(&hidden, SamplingControls { token_mask: Some(TokenMask::new(&mask[..4])), ..base })),
        ("controls.token_mask: 5 words for 5 rows of 2 words", b(&hidden, SamplingControls { token_mask: Some(TokenMask { words: &mask, words_per_row: 2 }), ..base })),
        ("draft_controls.token_mask: 2 words for 3 rows of 1 words", VerifyBatch { draft_logits: Some(&draft_logits), draft_controls: Some(SamplingControls { token_mask: Some(TokenMask::new(&mask[..2])), ..Default::default() }), ..b(&hidden, base) }),
        ("draft_controls.top_k: 1 entries for 2 requests", VerifyBatch { draft_logits: Some(&draft_logits), draft_controls: Some(SamplingControls { top_k: Some(&top_k[..1]), ..Default::default() }), ..b(&hidden, base) }),
        ("top_logprobs: 21, at most 20", VerifyBatch { top_logprobs: MAX_TOP_LOGPROBS + 1, ..b(&hidden, base) }),
    ];
    // The base batch passes.
    ctx.verify_and_finalize(&head, &b(&hidden, base)).unwrap();
    let mut summaries = ctx.summaries(16, 4).unwrap();
    for (want, batch) in &cases {
        refused_before_the_call(&ctx, ctx.verify_and_finalize(&head, batch).unwrap_err(), want);
        refused_before_the_call(&ctx, ctx.verify(&head, batch, &mut summaries).unwrap_err(), want);
        refused_before_the_call(&ctx, ctx.finalize(&head, batch, &summaries).unwrap_err(), want);
    }

    // Draft controls are per row.
    let h = Rng(24).values(3 * D);
    for (want, controls) in [
        ("controls.top_k: 2 entries for 3 rows", SamplingControls { top_k: Some(&top_k[..2]), ..Default::default() }),
        ("controls.logit_bias.offsets: 3 entries for R + 1 = 4", SamplingControls { logit_bias: Some(LogitBias { offsets: &[0, 0, 0], tokens: &[], values: &[] }), ..Default::default() }),
        ("controls.token_mask: 2 words for 3 rows of 1 words", SamplingControls { token_mask: Some(TokenMask::new(&mask[..2])), ..Default::default() }),
    ] {
        let err = ctx.draft(&head, &h, &DraftOptions { controls: Some(controls), ..Default::default() }).unwrap_err();
        refused_before_the_call(&ctx, err, want);
    }
}

#[test]
fn library_errors_name_the_control() {
    let (ctx, w) = fixture(4);
    let head = ctx.lm_head(&w, V, D).unwrap();
    let hidden = Rng(25).values(3 * D);
    let controls = SamplingControls { top_p: Some(&[0.0]), ..Default::default() };
    let batch = VerifyBatch { draft_offsets: &[0, 2], draft_tokens: &[1, 2], target_hidden: &hidden, controls: Some(controls), ..Default::default() };
    let err = ctx.verify_and_finalize(&head, &batch).unwrap_err();
    assert_eq!(err.status, sys::FLASHSPEC_ERR_INVALID_ARGUMENT);
    assert!(err.message.starts_with("batch->controls->top_p"), "{err}");
    let controls = SamplingControls { typical_epsilon: Some(&[0.1; 3]), ..Default::default() };
    let err = ctx.draft(&head, &hidden, &DraftOptions { controls: Some(controls), ..Default::default() }).unwrap_err();
    assert!(err.message.starts_with("params->controls->typical_epsilon"), "{err}");
}

#[test]
fn token_masks_pack_bit_i_of_word_i_over_32() {
    let mut allowed = vec![false; 2 * 70];
    for i in [0, 31, 32, 69] {
        allowed[i] = true;
    }
    allowed[70 + 33] = true;
    assert_eq!(pack_token_mask(&allowed, 70).unwrap(), vec![1 | 1 << 31, 1, 1 << 5, 0, 1 << 1, 0]);
    assert_eq!(pack_token_mask(&allowed, 71).unwrap_err().status, sys::FLASHSPEC_ERR_OUT_OF_RANGE);
    let buf = LogitBiasBuf::from_requests([vec![(3, 1.0)], vec![], vec![(4, 2.0), (5, -1.0)]]);
    assert_eq!(buf.offsets, [0, 1, 1, 3]);
    assert_eq!(buf.tokens, [3, 4, 5]);
}
