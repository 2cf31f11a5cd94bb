/*
 * tree_verify.c — verifying a tree of drafts in one pass.
 *
 * Medusa- and EAGLE-style drafters propose a tree: several candidates for
 * the next token, each with its own continuations. FlashSpec verifies the
 * whole tree in the same single pass over the LM head as a chain: the
 * target's hidden rows are one per node plus the root (row k + 1 is the
 * target after the path to node k), batch.draft_parents gives each node's
 * parent, and finalize walks the tree (flashspec.h, "Tree verify").
 *
 * Here the tree is
 *
 *            root
 *           /    \
 *      node 0   node 1      the drafter's two best guesses for the next token
 *         |        |
 *      node 2   node 3      one more guess after each
 *
 * The drafter is a stand-in: it scores tokens with a noisy copy of the LM
 * head, so its guesses are usually, not always, the target's. The same tree
 * is verified for two requests: at T = 0, where the accepted path must be
 * the greedy one (checked against an argmax walk computed here), and at
 * T = 0.8, where the path is a sample that keeps the target's distribution
 * exactly. CPU backend.
 *
 * Build (installed library):  cc tree_verify.c $(pkg-config --cflags --libs flashspec) -lm -o tree_verify
 */
#include <flashspec.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { VOCAB = 512, HIDDEN = 64, NODES = 4, REQUESTS = 2, ROWS_PER_REQUEST = NODES + 1 };
static const int32_t kParents[NODES] = {-1, -1, 0, 1};

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static float normal(void) {
  double u[2];
  for (int i = 0; i < 2; ++i) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    u[i] = ((double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) + 0.5) / 9007199254740992.0;
  }
  return (float)(sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]));
}

/* The tokens of largest and second-largest score of row h under w. */
static void top2(const float* w, const float* h, int32_t* best, int32_t* second) {
  double b = -INFINITY, s = -INFINITY;
  *best = *second = 0;
  for (int32_t t = 0; t < VOCAB; ++t) {
    double l = 0.0;
    for (int c = 0; c < HIDDEN; ++c) l += (double)w[(size_t)t * HIDDEN + c] * h[c];
    if (l > b) {
      s = b, *second = *best;
      b = l, *best = t;
    } else if (l > s) {
      s = l, *second = t;
    }
  }
}

#define CHECK(call)                                                                                \
  do {                                                                                             \
    flashspec_status status_ = (call);                                                             \
    if (status_ != FLASHSPEC_OK) {                                                                 \
      fprintf(stderr, "tree_verify: %s failed: %s: %s\n", #call, flashspec_status_name(status_),   \
              flashspec_context_last_error(ctx));                                                  \
      goto done;                                                                                   \
    }                                                                                              \
  } while (0)

int main(void) {
  int exit_code = 1;
  flashspec_context* ctx = NULL;
  flashspec_lm_head* head = NULL;
  float* w = malloc(sizeof(float) * VOCAB * HIDDEN);
  float* noisy = malloc(sizeof(float) * VOCAB * HIDDEN);
  float* hidden = malloc(sizeof(float) * REQUESTS * ROWS_PER_REQUEST * HIDDEN);
  if (!w || !noisy || !hidden) goto done;

  flashspec_context_params params;
  flashspec_context_params_init(&params);
  params.backend = FLASHSPEC_BACKEND_CPU;
  params.seed = 7;
  CHECK(flashspec_context_create(&params, &ctx));
  for (size_t i = 0; i < (size_t)VOCAB * HIDDEN; ++i) {
    w[i] = 0.4f * normal();
    noisy[i] = w[i] + 0.1f * normal(); /* the drafter's view of the head */
  }
  flashspec_tensor wt = flashspec_tensor_make(w, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, VOCAB, HIDDEN);
  CHECK(flashspec_lm_head_create(ctx, &wt, FLASHSPEC_LM_HEAD_COPY, &head));

  /* The target's hidden rows of one request: the root's and one per node
   * (stand-ins for the target's forward over the tree); both requests get
   * the same rows and the same tree. */
  for (int j = 0; j < ROWS_PER_REQUEST; ++j)
    for (int c = 0; c < HIDDEN; ++c) hidden[j * HIDDEN + c] = normal();
  for (int j = 0; j < ROWS_PER_REQUEST * HIDDEN; ++j) hidden[ROWS_PER_REQUEST * HIDDEN + j] = hidden[j];

  /* The drafter: the root's two best guesses, then the best guess after each. */
  int32_t tokens[REQUESTS * NODES], parents[REQUESTS * NODES], unused;
  top2(noisy, hidden, &tokens[0], &tokens[1]);
  top2(noisy, hidden + 1 * HIDDEN, &tokens[2], &unused);
  top2(noisy, hidden + 2 * HIDDEN, &tokens[3], &unused);
  for (int k = 0; k < NODES; ++k) {
    tokens[NODES + k] = tokens[k];
    parents[k] = parents[NODES + k] = kParents[k];
  }
  printf("draft tree: root -> {%d, %d}, %d -> %d, %d -> %d\n", tokens[0], tokens[1], tokens[0], tokens[2],
         tokens[1], tokens[3]);

  const int32_t offsets[REQUESTS + 1] = {0, NODES, 2 * NODES};
  const float temperatures[REQUESTS] = {0.0f, 0.8f};
  flashspec_tensor ht = flashspec_tensor_make(hidden, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                              REQUESTS * ROWS_PER_REQUEST, HIDDEN);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = REQUESTS;
  batch.draft_offsets = offsets;
  batch.draft_tokens = tokens;
  batch.draft_parents = parents;
  batch.target_hidden = &ht;
  batch.temperatures = temperatures;

  int32_t accepted[REQUESTS], emitted[REQUESTS * ROWS_PER_REQUEST], nodes[REQUESTS * ROWS_PER_REQUEST];
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted;
  result.emitted_tokens = emitted;
  result.accepted_nodes = nodes;
  CHECK(flashspec_verify_and_finalize(ctx, head, &batch, &result));

  /* The greedy walk, on the host: at each node the target's argmax; move to
   * the child holding it, else emit it and stop. */
  int32_t walk[ROWS_PER_REQUEST], depth = 0, node = -1;
  for (;;) {
    int32_t best, second;
    top2(w, hidden + (node + 1) * HIDDEN, &best, &second);
    walk[depth] = best;
    int32_t next = -1;
    for (int k = 0; k < NODES && next < 0; ++k)
      if (kParents[k] == node && tokens[k] == best) next = k;
    if (next < 0) break;
    node = next;
    ++depth;
  }

  int greedy_ok = accepted[0] == depth;
  for (int r = 0; r < REQUESTS; ++r) {
    const int32_t first = offsets[r] + r;
    printf("request %d (T = %.1f): %d node(s) accepted, path", r, temperatures[r], accepted[r]);
    for (int k = 0; k < accepted[r]; ++k) printf(" %d", nodes[first + k]);
    printf(", emitted");
    for (int k = 0; k <= accepted[r]; ++k) printf(" %d", emitted[first + k]);
    printf("\n");
  }
  for (int k = 0; greedy_ok && k <= depth; ++k) greedy_ok = emitted[k] == walk[k];
  printf(greedy_ok ? "T = 0: the accepted path and tokens are greedy decoding's\n"
                   : "T = 0: the tokens differ from greedy decoding\n");
  exit_code = greedy_ok ? 0 : 1;

done:
  flashspec_lm_head_destroy(head);
  flashspec_context_destroy(ctx);
  free(w);
  free(noisy);
  free(hidden);
  return exit_code;
}
