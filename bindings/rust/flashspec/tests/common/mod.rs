//! What the sparse, shard and tree tests share: deterministic data without
//! crates, a CPU context, ragged batches of drafts (chains or trees) and the
//! T = 0 walk down them by hand, and the two kinds of refusal.
#![allow(dead_code)] // each test crate uses its part

use flashspec::{sys, Context, ContextOptions, Error, VerifyBatch};

pub const V: usize = 200;
pub const D: usize = 16;

/// xorshift64: deterministic test data without crates.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo) as u64) as i64
    }
    /// Roughly standard normal (Irwin–Hall of 12 uniforms).
    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| ((0..12).map(|_| self.unit()).sum::<f64>() - 6.0) as f32 * scale).collect()
    }
}

pub fn context() -> Context {
    Context::new(&ContextOptions { backend: flashspec::Backend::Cpu, seed: 4321, cpu_threads: 2, max_rows: 256, max_requests: 64, ..Default::default() }).unwrap()
}

pub fn weights() -> Vec<f32> {
    Rng::new(11).normals(V * D, 1.0)
}

pub fn argmax_row(w: &[f32], hidden: &[f32], row: usize) -> i32 {
    let logit = |t: usize| (0..D).map(|k| f64::from(hidden[row * D + k]) * f64::from(w[t * D + k])).sum::<f64>();
    (0..V).fold(0, |best, t| if logit(t) > logit(best) { t } else { best }) as i32
}

/// The owned arrays of a ragged batch.
pub struct Batch {
    pub offsets: Vec<i32>,
    pub drafts: Vec<i32>,
    /// Each draft's parent node; for a chain, the previous draft.
    pub parents: Vec<i32>,
    pub tree: bool,
    pub hidden: Vec<f32>,
    pub temperatures: Vec<f32>,
    pub steps: Vec<u64>,
}

impl Batch {
    /// `temperatures.len()` requests with 0..4 drafts each: most drafts are
    /// the target argmax of the row that scores them (so many are
    /// accepted), the rest random. Trees get random parents.
    pub fn new(w: &[f32], rng: &mut Rng, temperatures: Vec<f32>, tree: bool) -> Batch {
        let requests = temperatures.len();
        let lengths: Vec<i64> = (0..requests).map(|_| rng.range(0, 5)).collect();
        let mut offsets = vec![0i32];
        for n in &lengths {
            offsets.push(offsets.last().unwrap() + *n as i32);
        }
        let rows = *offsets.last().unwrap() as usize + requests;
        let hidden = rng.normals(rows * D, 3.0);
        let (mut parents, mut drafts) = (Vec::new(), Vec::new());
        for (r, &n) in lengths.iter().enumerate() {
            let base = offsets[r] as usize + r;
            for j in 0..n {
                let parent = if tree && j > 0 { rng.range(-1, j) } else { j - 1 };
                parents.push(parent as i32);
                let best = argmax_row(w, &hidden, base + (parent + 1) as usize);
                // In a tree, a node's second child is the argmax and its first
                // is wrong half the time: paths a chain would not take.
                let later_sibling = tree && parents[parents.len() - 1 - j as usize..parents.len() - 1].contains(&(parent as i32));
                let p_best = if later_sibling { 1.0 } else if tree { 0.5 } else { 0.75 };
                drafts.push(if rng.unit() < p_best { best } else { rng.range(0, V as i64) as i32 });
            }
        }
        Batch { offsets, drafts, parents, tree, hidden, steps: vec![3; requests], temperatures }
    }

    pub fn rows(&self) -> usize {
        self.hidden.len() / D
    }

    pub fn view(&self) -> VerifyBatch<'_> {
        VerifyBatch {
            draft_offsets: &self.offsets,
            draft_tokens: &self.drafts,
            target_hidden: &self.hidden,
            temperatures: Some(&self.temperatures),
            steps: Some(&self.steps),
            draft_parents: self.tree.then_some(&self.parents[..]),
            ..Default::default()
        }
    }

    /// T = 0 tree verify by hand (flashspec.h, "Tree verify"): from the
    /// root, y = the argmax of the current node's row; descend into the
    /// first child with token y, else emit y and stop. A chain is the tree
    /// whose node k has parent k - 1. Returns (tokens, node indices).
    pub fn greedy_walk(&self, w: &[f32], r: usize) -> (Vec<i32>, Vec<i32>) {
        let (start, n, base) = (self.offsets[r] as usize, (self.offsets[r + 1] - self.offsets[r]) as usize, self.offsets[r] as usize + r);
        let (mut node, mut tokens, mut nodes) = (-1i32, Vec::new(), Vec::new());
        loop {
            let y = argmax_row(w, &self.hidden, base + (node + 1) as usize);
            tokens.push(y);
            match (0..n).find(|&k| self.parents[start + k] == node && self.drafts[start + k] == y) {
                None => return (tokens, nodes),
                Some(child) => {
                    node = child as i32;
                    nodes.push(node);
                }
            }
        }
    }
}

/// A refusal by the crate before the C call: OUT_OF_RANGE naming `name`,
/// and the context's last error still the library's last one.
pub fn refused_before_the_call(ctx: &Context, err: Error, name: &str) {
    assert_eq!(err.status, sys::FLASHSPEC_ERR_OUT_OF_RANGE, "{err}");
    assert!(err.message.starts_with(name), "{err}");
    assert_ne!(ctx.last_error(), err.message, "the library saw the call: {err}");
}

pub fn assert_library_error(err: Error, status: sys::flashspec_status, name: &str) {
    assert_eq!(err.status, status, "{err}");
    assert!(err.message.contains(name), "{err}");
}
