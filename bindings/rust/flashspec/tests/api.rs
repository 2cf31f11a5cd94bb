//! The safe crate against a plain reference, on the CPU backend.
use flashspec::{sys, Backend, Context, ContextOptions, DraftOptions, VerifyBatch};

const V: usize = 30;
const D: usize = 8;

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

fn logits(w: &[f32], h: &[f32], row: usize) -> Vec<f64> {
    (0..V).map(|t| (0..D).map(|k| h[row * D + k] as f64 * w[t * D + k] as f64).sum()).collect()
}

fn argmax(v: &[f64]) -> usize {
    (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best })
}

#[test]
fn greedy_draft_matches_reference() {
    let ctx = Context::new(&ContextOptions { backend: Backend::Cpu, seed: 3, cpu_threads: 2, ..Default::default() }).unwrap();
    assert_eq!(ctx.backend(), Backend::Cpu);
    let w = values(1, V * D);
    let head = ctx.lm_head(&w, V, D).unwrap();
    assert_eq!((head.vocab_size(), head.hidden_size()), (V, D));
    let h = values(2, 4 * D);
    let (tokens, scores) = ctx.draft(&head, &h, &DraftOptions::default()).unwrap();
    for r in 0..4 {
        let l = logits(&w, &h, r);
        assert_eq!(tokens[r] as usize, argmax(&l));
        assert!((scores[r] as f64 - l[argmax(&l)]).abs() < 1e-4);
    }
}

#[test]
fn sampled_draft_follows_the_randomness_contract() {
    let ctx = Context::cpu(0).unwrap();
    let w = values(5, V * D);
    let head = ctx.lm_head(&w, V, D).unwrap();
    let h = values(6, 3 * D);
    let (seeds, ids, steps, positions) = ([4u64, 5, 6], [9u64, 9, 1], [0u64, 1, 2], [0i32, 1, 2]);
    let options = DraftOptions { temperature: 0.8, seeds: Some(&seeds), request_ids: Some(&ids), steps: Some(&steps), positions: Some(&positions), ..Default::default() };
    let (tokens, _) = ctx.draft(&head, &h, &options).unwrap();
    for r in 0..3 {
        let l = logits(&w, &h, r);
        let noisy: Vec<f64> = (0..V)
            .map(|i| {
                let u = flashspec::rng_uniform(seeds[r], ids[r], steps[r], positions[r], sys::FLASHSPEC_RNG_DRAFT_NOISE, i as i32);
                l[i] / 0.8 - (-u.ln()).ln()
            })
            .collect();
        assert_eq!(tokens[r] as usize, argmax(&noisy), "row {r}");
    }
}

#[test]
fn greedy_verify_equals_greedy_decoding() {
    let ctx = Context::cpu(1).unwrap();
    let w = values(7, V * D);
    let head = ctx.lm_head(&w, V, D).unwrap();
    let hidden = values(8, 5 * D); // requests with 2 and 1 drafts
    let best = |row: usize| argmax(&logits(&w, &hidden, row)) as i32;
    let drafts = [best(0), (best(1) + 1) % V as i32, best(3)];
    let (offsets, temps, steps) = ([0, 2, 3], [0.0f32, 0.0], [3u64, 4]);
    let batch = VerifyBatch { draft_offsets: &offsets, draft_tokens: &drafts, target_hidden: &hidden, temperatures: Some(&temps), steps: Some(&steps), ..Default::default() };
    let fused = ctx.verify_and_finalize(&head, &batch).unwrap();
    assert_eq!(fused.tokens(0), &[drafts[0], best(1)]);
    assert_eq!(fused.tokens(1), &[drafts[2], best(4)]);
    assert_eq!(fused.emitted_tokens[2], -1);
    assert_eq!(fused.next_steps, vec![4, 5]);

    let mut summaries = ctx.summaries(16, 4).unwrap();
    ctx.verify(&head, &batch, &mut summaries).unwrap();
    assert_eq!(ctx.finalize(&head, &batch, &summaries).unwrap(), fused);

    // `greedy`: the same batch without the temperatures; not with them.
    let flagged = VerifyBatch { temperatures: None, greedy: true, ..batch.clone() };
    assert_eq!(ctx.verify_and_finalize(&head, &flagged).unwrap(), fused);
    let both = VerifyBatch { greedy: true, ..batch };
    let err = ctx.verify_and_finalize(&head, &both).unwrap_err();
    assert_eq!(err.status, sys::FLASHSPEC_ERR_INVALID_ARGUMENT);
    assert!(err.message.contains("batch->temperatures"), "{}", err.message);
}

#[test]
fn errors_carry_status_and_message() {
    let ctx = Context::cpu(1).unwrap();
    let head = ctx.lm_head(&values(9, V * D), V, D).unwrap();
    let hidden = vec![0.0f32; 2 * D];
    let batch = VerifyBatch { draft_offsets: &[0, 1], draft_tokens: &[V as i32 + 2], target_hidden: &hidden, ..Default::default() };
    let err = ctx.verify_and_finalize(&head, &batch).unwrap_err();
    assert_eq!(err.status, sys::FLASHSPEC_ERR_OUT_OF_RANGE);
    assert_eq!(err.status_name(), "FLASHSPEC_ERR_OUT_OF_RANGE");
    assert!(err.message.contains("draft_tokens"), "{err}");
    assert_eq!(ctx.last_error(), err.message);

    let mut bad = vec![0.0f32; D];
    bad[2] = f32::NAN;
    assert_eq!(ctx.draft(&head, &bad, &DraftOptions::default()).unwrap_err().status, sys::FLASHSPEC_ERR_NON_FINITE);
    let short = [1u64];
    let two_rows = vec![0.0f32; 2 * D];
    let err = ctx.draft(&head, &two_rows, &DraftOptions { seeds: Some(&short), ..Default::default() }).unwrap_err();
    assert!(err.message.contains("seeds"), "{err}");
    if flashspec::cuda_device_count() == 0 {
        let err = Context::new(&ContextOptions { backend: Backend::Cuda, ..Default::default() }).err().unwrap();
        assert_eq!(err.status, sys::FLASHSPEC_ERR_NO_DEVICE);
        assert!(!err.message.is_empty());
    }
}

#[test]
fn context_moves_between_threads() {
    let ctx = Context::cpu(2).unwrap();
    let tokens = std::thread::spawn(move || {
        let head = ctx.lm_head(&values(10, V * D), V, D).unwrap();
        ctx.draft(&head, &values(11, D), &DraftOptions::default()).unwrap().0
    })
    .join()
    .unwrap();
    assert_eq!(tokens.len(), 1);
}

#[test]
fn version_rng_and_plugin_table() {
    assert_eq!(flashspec::abi_version(), sys::FLASHSPEC_ABI_VERSION);
    assert_eq!(flashspec::version_number(), sys::FLASHSPEC_VERSION_NUMBER);
    assert_eq!(flashspec::version(), format!("{}.{}.{}", sys::FLASHSPEC_VERSION_MAJOR, sys::FLASHSPEC_VERSION_MINOR, sys::FLASHSPEC_VERSION_PATCH));
    // Random123 known answer for zero counter and key.
    assert_eq!(flashspec::philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
    let table = flashspec::plugin_table(sys::FLASHSPEC_ABI_VERSION).unwrap();
    assert_eq!(table.abi_version, sys::FLASHSPEC_ABI_VERSION);
    assert!(table.struct_size as usize <= std::mem::size_of::<sys::flashspec_api>());
    assert_eq!(unsafe { (table.version_number.unwrap())() }, flashspec::version_number());
    assert!(flashspec::plugin_table(sys::FLASHSPEC_ABI_VERSION + 1).is_none());
}

#[test]
fn draft_top_k_ranks_the_raw_log_softmax() {
    let ctx = Context::new(&ContextOptions { backend: Backend::Cpu, cpu_threads: 2, ..Default::default() }).unwrap();
    let w = values(21, V * D);
    let head = ctx.lm_head(&w, V, D).unwrap();
    let h = values(22, 3 * D);
    let k = 5;
    let (tokens, logprobs) = ctx.draft_top_k(&head, &h, &DraftOptions::default(), k).unwrap();
    assert_eq!((tokens.len(), logprobs.len()), (3 * k, 3 * k));
    for r in 0..3 {
        let l = logits(&w, &h, r);
        let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + l.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        let mut ranked: Vec<usize> = (0..V).collect();
        ranked.sort_by(|&a, &b| l[b].partial_cmp(&l[a]).unwrap().then(a.cmp(&b)));
        for i in 0..k {
            assert_eq!(tokens[r * k + i] as usize, ranked[i], "row {r} slot {i}");
            assert!((logprobs[r * k + i] as f64 - (l[ranked[i]] - lse)).abs() < 1e-4);
        }
    }
    for bad in [0, sys::FLASHSPEC_MAX_DRAFT_TOP_K as usize + 1] {
        let err = ctx.draft_top_k(&head, &h, &DraftOptions::default(), bad).unwrap_err();
        assert_eq!(err.status, sys::FLASHSPEC_ERR_OUT_OF_RANGE);
    }
}
