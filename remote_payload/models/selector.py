"""DFlash2's candidate selector: re-ranking each slot's top-K drafter candidates given the previous draft.

At slot t of a block the candidates are the top-K of the drafter's logits (already scaled by the output
multiplier and soft-capped). Candidate b, after predecessor a (the block's anchor token for slot 1, the previous
slot's draft after that), scores ``logit(b) + <P[a] * (W h_t), S[b]>`` with P, S the predecessor and successor
codebooks (vocab x rank) and W the hidden projection (rank x hidden). The walk is sequential over slots but every
step is batched over the blocks (anchors), so drafting many anchors costs B-1 small steps, not A x (B-1).

What ``topk`` means here: a slot's candidates ranked by their selector score given the walked predecessor, best
first, with log-probabilities of softmax(scores) over the K candidates; the walk follows the first of them.
"""

from __future__ import annotations

import torch


class CandidateSelector:
    def __init__(self, predecessor: torch.Tensor, successor: torch.Tensor, hidden_projection: torch.Tensor,
                 top_k: int):
        self.predecessor = predecessor  # [V, R]
        self.successor = successor  # [V, R]
        self.hidden_projection = hidden_projection  # [R, H]
        self.top_k = top_k

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [..., V] (processed) -> (candidate logits, candidate ids), each [..., K]."""
        return torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1)

    def scores(self, logits: torch.Tensor, hidden: torch.Tensor, predecessors: torch.Tensor):
        """One slot for N blocks: logits [N, V], hidden [N, H], predecessors [N] -> (scores, ids), each [N, K]."""
        return self.score(*self.candidates(logits), hidden, predecessors)

    def score(self, cand_logits: torch.Tensor, cand_ids: torch.Tensor, hidden: torch.Tensor,
              predecessors: torch.Tensor) -> torch.Tensor:
        """Scores [N, K] of given candidates (logits and ids [N, K]) after ``predecessors`` [N]."""
        query = self.predecessor[predecessors] * (hidden @ self.hidden_projection.T)  # [N, R]
        return cand_logits + torch.einsum("nr,nkr->nk", query, self.successor[cand_ids])

    def walk(self, logits: torch.Tensor, hidden: torch.Tensor, anchor_tokens: torch.Tensor,
             topk: int = 1, temperature: float = 0.0, generator: torch.Generator | None = None):
        """Walk every block slot by slot. logits [N, S, V], hidden [N, S, H], anchor_tokens [N].

        T = 0 follows the best candidate; T > 0 draws from softmax(scores / T) over the K candidates.
        Returns (ids [N, S, k], logprobs [N, S, k], drafts [N, S]) with k = min(topk, K), ranked by score.
        """
        return self.walk_candidates(*self.candidates(logits), hidden, anchor_tokens, topk, temperature, generator)

    def walk_candidates(self, cand_logits: torch.Tensor, cand_ids: torch.Tensor, hidden: torch.Tensor,
                        anchor_tokens: torch.Tensor, topk: int = 1, temperature: float = 0.0,
                        generator: torch.Generator | None = None):
        """``walk`` from each slot's candidates (logits and ids [N, S, K]): a drafter with a large vocabulary
        takes the top-K a chunk of rows at a time and never holds [N, S, V]."""
        prev = anchor_tokens
        ids, lps, drafts = [], [], []
        for slot in range(cand_ids.shape[1]):
            scores = self.score(cand_logits[:, slot], cand_ids[:, slot], hidden[:, slot], prev)
            cand = cand_ids[:, slot]
            order = torch.argsort(scores, dim=-1, descending=True)
            scores, cand = scores.gather(-1, order), cand.gather(-1, order)
            k = min(topk, cand.shape[-1])
            ids.append(cand[:, :k])
            lps.append(torch.log_softmax(scores.float(), dim=-1)[:, :k])
            if temperature > 0:
                pick = torch.multinomial(torch.softmax(scores.float() / temperature, dim=-1), 1,
                                         generator=generator)[:, 0]
                prev = cand.gather(-1, pick[:, None])[:, 0]
            else:
                prev = cand[:, 0]
            drafts.append(prev)
        return torch.stack(ids, 1), torch.stack(lps, 1), torch.stack(drafts, 1)

    def slot_logprobs(self, logits: torch.Tensor, hidden: torch.Tensor, predecessors: torch.Tensor,
                      temperature: float) -> torch.Tensor:
        """The selector's law at every slot along given predecessors [N, S] (the anchor token, then the tokens
        that follow it): log softmax(scores / T) over the K candidates, -inf elsewhere -> [N, S, V] float32."""
        return self.slot_logprobs_candidates(*self.candidates(logits), hidden, predecessors, temperature,
                                             logits.shape[-1])

    def slot_logprobs_candidates(self, cand_logits: torch.Tensor, cand_ids: torch.Tensor, hidden: torch.Tensor,
                                 predecessors: torch.Tensor, temperature: float, vocab: int) -> torch.Tensor:
        """``slot_logprobs`` from each slot's candidates (logits and ids [N, S, K])."""
        N, S, K = cand_ids.shape
        scores = self.score(cand_logits.reshape(N * S, K), cand_ids.reshape(N * S, K),
                            hidden.reshape(N * S, -1), predecessors.reshape(-1))
        out = torch.full((N * S, vocab), float("-inf"), dtype=torch.float32, device=cand_ids.device)
        out.scatter_(-1, cand_ids.reshape(N * S, K), torch.log_softmax(scores.float() / temperature, dim=-1))
        return out.view(N, S, vocab)
