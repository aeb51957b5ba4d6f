/* mega_gate.h - the fast dg_bf16_mega_gate (engine/mega_gate.c). */
#ifndef DG_ENGINE_MEGA_GATE_H
#define DG_ENGINE_MEGA_GATE_H

#include "../reference/ref_mega_gate.h"

/* Tokens per chunk of the fast path for a call of `tokens` tokens (get_bf16_mega_gate_config's
 * block_tokens). */
int64_t dg_gate_block_tokens(int64_t tokens);

/* The validated problem p (tokens > 0): the engine's logits per chunk, then the gate. Only
 * allocation failures are errors (then, when T > one chunk, earlier chunks may be written). */
dg_status dg_engine_mega_gate(const dg_gate_problem *p);

#endif /* DG_ENGINE_MEGA_GATE_H */
