"""Explanations for ViT predictions: attention maps, faithfulness scores, rendering.

`vit.explain(model, images, method)` is `maps.explain`; this package holds it and the rest:

- `inputs`: the images to explain, from files, folders or a dataset, batched;
- `tokens`: where tokens sit and what the classifier reads out;
- `rules`: per-layer rollout, grad-rollout and relevancy rules (self- and cross-attention);
- `capture`: explain mode that keeps every layer's attention and gradient (reference, analysis);
- `maps`: `explain(model, images, method)`, batched, jitted, memory flat in depth;
- `text`: `explain_prompt(model, images, prompt)` for text-conditioned models: the patch map
  and per-token text relevance of the prompt-match answer (Chefer's bi-modal rules, and the
  prompt head's own reading of the text);
- `faithfulness`: deletion / insertion curves with bootstrap intervals;
- `render`: overlays, raw maps, safe output names, the HTML gallery.
"""

from vit.explanations.maps import GRADIENT_METHODS, METHODS, Explanation, explain
from vit.explanations.text import PromptExplanation, explain_prompt, text_relevance

__all__ = ["GRADIENT_METHODS", "METHODS", "Explanation", "PromptExplanation", "explain",
           "explain_prompt", "text_relevance"]
