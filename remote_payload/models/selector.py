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
        cand_logits, cand_ids = self.candidates(logits)
        query = self.predecessor[predecessors] * (hidden @ self.hidden_projection.T)  # [N, R]
        bonus = torch.einsum("nr,nkr->nk", query, self.successor[cand_ids])
        return cand_logits + bonus, cand_ids

    def walk(self, logits: torch.Tensor, hidden: torch.Tensor, anchor_tokens: torch.Tensor,
             topk: int = 1, temperature: float = 0.0, generator: torch.Generator | None = None):
        """Walk every block slot by slot. logits [N, S, V], hidden [N, S, H], anchor_tokens [N].

        T = 0 follows the best candidate; T > 0 draws from softmax(scores / T) over the K candidates.
        Returns (ids [N, S, k], logprobs [N, S, k], drafts [N, S]) with k = min(topk, K), ranked by score.
        """
        prev = anchor_tokens
        ids, lps, drafts = [], [], []
        for slot in range(logits.shape[1]):
            scores, cand = self.scores(logits[:, slot], hidden[:, slot], prev)
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
        N, S, V = logits.shape
        scores, cand = self.scores(logits.reshape(N * S, V), hidden.reshape(N * S, -1), predecessors.reshape(-1))
        out = torch.full((N * S, V), float("-inf"), dtype=torch.float32, device=logits.device)
        out.scatter_(-1, cand, torch.log_softmax(scores.float() / temperature, dim=-1))
        return out.view(N, S, V)
