//! 8-bit LM heads (Context::lm_head_quantized, Context::lm_head_codes,
//! LmHead::dtype) on the CPU backend: the documented quantisation rule
//! reproduced here, greedy drafts against float64 logits of the dequantised
//! weights, and the library's errors for bad input.
mod common;

use common::{context, Rng, D, V};
use flashspec::{sys, Codes, Dtype, DraftOptions, LmHead};

const ROWS: usize = 6;

/// The value of an e4m3 ("e4m3fn") bit pattern.
fn e4m3_value(code: u8) -> f64 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exponent, mantissa) = (((code >> 3) & 0xF) as i32, (code & 7) as f64);
    if exponent == 0 {
        sign * mantissa * 2f64.powi(-9)
    } else {
        sign * (1.0 + mantissa / 8.0) * 2f64.powi(exponent - 7)
    }
}

/// Round half to even, by hand.
fn round_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 { r - x.signum() } else { r }
}

/// x to the nearest e4m3 value, ties to even, saturating at ±448.
fn e4m3_round(x: f32) -> f64 {
    let a = (x as f64).abs();
    if a == 0.0 {
        return 0.0;
    }
    let exponent = a.log2().floor().max(-6.0);
    let step = 2f64.powf(exponent - 3.0);
    (round_even(a / step) * step).min(448.0).copysign(x as f64)
}

/// The documented rule in f32, as the library computes it: the dequantised
/// `[V, D]` weights in f64.
fn quantize_ref(w: &[f32], stored: Dtype) -> Vec<f64> {
    let mut out = vec![0.0; w.len()];
    for v in 0..V {
        let row = &w[v * D..(v + 1) * D];
        let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        let mut scale = amax / if stored == Dtype::E4m3 { 448.0 } else { 127.0 };
        if !(scale > 0.0) {
            scale = 1.0;
        }
        for k in 0..D {
            let q = row[k] / scale;
            let value = if stored == Dtype::E4m3 { e4m3_round(q) } else { round_even(q as f64).clamp(-127.0, 127.0) };
            out[v * D + k] = value * scale as f64;
        }
    }
    out
}

/// Hidden rows (a scaled vocabulary row plus noise each) whose f64 logits
/// have a clear winner, and those winners.
fn separated_hidden(reference: &[f64], seed: u64) -> (Vec<f32>, Vec<i32>) {
    let mut rng = Rng::new(seed);
    let mut h = vec![0f32; ROWS * D];
    let mut want = vec![0i32; ROWS];
    for r in 0..ROWS {
        let pick = rng.range(0, V as i64) as usize;
        let row = &reference[pick * D..(pick + 1) * D];
        let amax = row.iter().fold(0f64, |m, x| m.max(x.abs()));
        let noise = rng.normals(D, 0.1);
        for k in 0..D {
            h[r * D + k] = (3.0 * row[k] / amax) as f32 + noise[k];
        }
        let mut logits: Vec<(f64, usize)> = (0..V).map(|v| ((0..D).map(|k| h[r * D + k] as f64 * reference[v * D + k]).sum(), v)).collect();
        logits.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap());
        assert!(logits[0].0 - logits[1].0 > 1e-3 * logits[0].0.abs().max(1.0), "row {r}: logits too close");
        want[r] = logits[0].1 as i32;
    }
    (h, want)
}

fn assert_greedy(ctx: &flashspec::Context, head: &LmHead<'_>, reference: &[f64], seed: u64) {
    let (h, want) = separated_hidden(reference, seed);
    let (tokens, _) = ctx.draft(head, &h, &DraftOptions::default()).unwrap();
    assert_eq!(tokens, want, "greedy draft against the f64 argmax of the dequantised weights");
}

#[test]
fn reference_rounding_knows_the_documented_codes() {
    let values: Vec<f64> = [0x38u8, 0x40, 0xB8, 0x30, 0x7E, 0x01].iter().map(|&c| e4m3_value(c)).collect();
    assert_eq!(values, [1.0, 2.0, -1.0, 0.5, 448.0, 2f64.powi(-9)]);
    assert_eq!((e4m3_round(1.0625), e4m3_round(1.1875), e4m3_round(500.0)), (1.0, 1.25, 448.0));
    assert_eq!((round_even(2.5), round_even(-2.5), round_even(3.5), round_even(-1.2)), (2.0, -2.0, 4.0, -1.0));
}

#[test]
fn quantised_heads_read_back_their_dtype() {
    let ctx = context();
    let w = Rng::new(1).normals(V * D, 1.0);
    for stored in [Dtype::E4m3, Dtype::I8] {
        let head = ctx.lm_head_quantized(&w, V, D, stored).unwrap();
        assert_eq!((head.dtype(), head.vocab_size(), head.hidden_size()), (stored, V, D));
    }
    assert_eq!(ctx.lm_head(&w, V, D).unwrap().dtype(), Dtype::F32);
    assert_eq!(Dtype::from_raw(sys::FLASHSPEC_DTYPE_I8), Some(Dtype::I8));
    assert_eq!(Dtype::E4m3.raw(), sys::FLASHSPEC_DTYPE_E4M3);
}

#[test]
fn greedy_draft_of_quantised_heads_matches_the_dequantised_weights() {
    let ctx = context();
    let w = Rng::new(4).normals(V * D, 1.0);
    for (i, stored) in [Dtype::E4m3, Dtype::I8].into_iter().enumerate() {
        let head = ctx.lm_head_quantized(&w, V, D, stored).unwrap();
        assert_greedy(&ctx, &head, &quantize_ref(&w, stored), 10 + i as u64);
    }
}

#[test]
fn prequantised_codes_with_scales() {
    let ctx = context();
    let mut rng = Rng::new(5);
    let scales: Vec<f32> = (0..V).map(|_| 0.001 + 0.01 * rng.unit() as f32).collect();
    let i8_codes: Vec<i8> = (0..V * D).map(|_| rng.range(-128, 128) as i8).collect();
    let mut e4m3_codes: Vec<u8> = (0..V * D).map(|_| rng.range(0, 256) as u8).map(|c| if c & 0x7F == 0x7F { 0x38 } else { c }).collect();
    e4m3_codes[..4].copy_from_slice(&[0x38, 0x40, 0xB8, 0x30]); // 1, 2, -1, 0.5
    let ref_i8: Vec<f64> = (0..V * D).map(|i| i8_codes[i] as f64 * scales[i / D] as f64).collect();
    let ref_e4m3: Vec<f64> = (0..V * D).map(|i| e4m3_value(e4m3_codes[i]) * scales[i / D] as f64).collect();
    assert_eq!(&ref_e4m3[..4], &[1.0, 2.0, -1.0, 0.5].map(|x: f64| x * scales[0] as f64));

    let head = ctx.lm_head_codes(Codes::I8(&i8_codes), &scales, V, D).unwrap();
    assert_eq!(head.dtype(), Dtype::I8);
    assert_greedy(&ctx, &head, &ref_i8, 20);
    let head = ctx.lm_head_codes(Codes::E4m3(&e4m3_codes), &scales, V, D).unwrap();
    assert_eq!(head.dtype(), Dtype::E4m3);
    assert_greedy(&ctx, &head, &ref_e4m3, 21);
}

#[test]
fn bad_input_is_the_library_status() {
    let ctx = context();
    let w = Rng::new(6).normals(V * D, 1.0);
    let codes = vec![0i8; V * D];
    let ones = |n: usize| vec![1f32; n];
    let with_scale = |x: f32| {
        let mut s = vec![1f32; V];
        s[V / 2] = x;
        s
    };
    let mut nan_codes = vec![0x38u8; V * D];
    nan_codes[5] = 0x7F;
    let cases: Vec<(&str, sys::flashspec_status, &str, flashspec::Result<LmHead<'_>>)> = vec![
        ("stored f32", sys::FLASHSPEC_ERR_DTYPE_MISMATCH, "stored", ctx.lm_head_quantized(&w, V, D, Dtype::F32)),
        ("stored bf16", sys::FLASHSPEC_ERR_DTYPE_MISMATCH, "stored", ctx.lm_head_quantized(&w, V, D, Dtype::Bf16)),
        ("scales missing", sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "scales", ctx.lm_head_codes(Codes::I8(&codes), &[], V, D)),
        ("scales short", sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "scales", ctx.lm_head_codes(Codes::I8(&codes), &ones(V - 1), V, D)),
        ("scales long", sys::FLASHSPEC_ERR_INVALID_ARGUMENT, "scales", ctx.lm_head_codes(Codes::I8(&codes), &ones(V + 1), V, D)),
        ("negative scale", sys::FLASHSPEC_ERR_NON_FINITE, "scales", ctx.lm_head_codes(Codes::I8(&codes), &with_scale(-1.0), V, D)),
        ("NaN scale", sys::FLASHSPEC_ERR_NON_FINITE, "scales", ctx.lm_head_codes(Codes::I8(&codes), &with_scale(f32::NAN), V, D)),
        ("Inf scale", sys::FLASHSPEC_ERR_NON_FINITE, "scales", ctx.lm_head_codes(Codes::I8(&codes), &with_scale(f32::INFINITY), V, D)),
        ("NaN code", sys::FLASHSPEC_ERR_NON_FINITE, "weight", ctx.lm_head_codes(Codes::E4m3(&nan_codes), &ones(V), V, D)),
        ("codes short", sys::FLASHSPEC_ERR_OUT_OF_RANGE, "weight", ctx.lm_head_codes(Codes::I8(&codes[1..]), &ones(V), V, D)),
        ("weights long", sys::FLASHSPEC_ERR_OUT_OF_RANGE, "weight", ctx.lm_head_quantized(&w, V - 1, D, Dtype::I8)),
    ];
    for (name, status, word, result) in cases {
        let Err(e) = result else { panic!("{name}: no error") };
        assert_eq!(e.status, status, "{name}: {e}");
        assert!(e.message.contains(word), "{name}: {e}");
    }
}
