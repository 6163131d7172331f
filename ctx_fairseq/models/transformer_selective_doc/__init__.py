"""``transformer_selective_doc``: selective attention over the whole document
(Maruf, Martins & Haffari, NAACL 2019, "Selective Attention for
Context-aware Neural Machine Translation").

A fairseq Transformer plus one Document-level Context Layer
(:class:`ctx_fairseq.modules.selective_attention.DocumentContextLayer`,
Eq. 3-8) beside the encoder stack (``--context-integration encoder``,
monolingual context, Sec. 3.3) or beside the decoder stack (``decoder``,
bilingual context). This file only wires the module into fairseq; the
equations are in the module.

Inputs (``--task document_translation --document-context online|offline
--document-memory``): each batch carries its documents' memory, every
sentence a query may see, once (``mem_src_tokens``, ``mem_doc``,
``mem_pos``, ``query_doc``, ``query_pos``, ``query_mem_row``; with target
context on, ``mem_tgt_tokens``), see
:meth:`ctx_fairseq.data.document_dataset.DocumentContextDataset.collate_memory`.
No document is truncated: a sentence sees every visible sentence of its
document, and memory grows linearly with the document.

Memory (``--context-memory``):

* ``shared`` (an option, beyond the paper; needs no stage-1 checkpoint): the
  memory comes from this model in the same forward pass, with gradients. Encoder integration: the last encoder layer's states of the
  memory sentences; a memory sentence that is also a query of the batch is
  encoded once (``query_mem_row``). Decoder integration: the memory
  sentences' sources are encoded (queries reused) and their targets decoded
  with teacher forcing; keys are the last decoder layer's source-attention
  outputs (the context vectors), values its output states.
* ``frozen`` (the default, the paper's, Sec. 3.3: "the keys and values
  produced from the pre-trained sentence-level NMT model"; a new run needs
  ``--init-from-sentence-checkpoint``): the same computation by a frozen copy of the
  sentence-level model (``memory_encoder`` / ``memory_decoder``, taken when
  the model is built, i.e. from ``--init-from-sentence-checkpoint`` in stage
  2, never trained, saved in the checkpoint), under ``torch.no_grad`` in eval
  mode; with ``--freeze-sentence-level`` the model's own layers are that
  model and no copy is made. Trade-off: ``frozen`` needs no backward through
  the memory (less memory and time per step, the paper's setting, stable
  keys); ``shared`` adapts the memory to the document model at the cost of a
  backward through it.

Frozen memory cache (the paper stores the frozen model's keys and values):
the states of a sentence under the frozen model depend only on its tokens,
so the model keeps them in a content-addressed LRU cache
(:class:`ctx_fairseq.modules.sentence_cache.SentenceStateCache`,
``model.memory_cache``, shared by the encoder and the decoder): the encoder
memory states keyed on the source tokens (encoder integration's memory; for
decoder integration the memory sources the frozen decoder attends to), and,
for decoder integration, the decoder memory keys and values keyed on the
source and the target tokens. A sentence is encoded once, whatever its
batch, document (identical sentences share one entry) or position; a long
document cut into many chunks does not re-encode its memory for each. On a
miss the frozen model runs without gradients in eval mode on the missing
sentences only, sorted by length, in chunks of ``MEMORY_CHUNK_TOKENS``
padded tokens; entries hold the real tokens' states on the CPU in the
precision they were computed in (the model's: cached == uncached; a
512-dimensional state of a 25-token sentence: 50 KB in float32, 25 KB under
``--fp16``; decoder integration stores three such tensors per sentence:
source states, keys, values); each batch's memory is assembled from them
into the padded ``S x W x C`` tensors on the model's device and dtype
(padding positions 0, masked as before). Keys are 128-bit digests of the
tokens made by the task's collater (``mem_src_key``/``mem_tgt_key``, numpy
arrays that stay on the host): a batch looks its memory up without reading
anything back, copies all its misses' states to the host at once, and
assembles its memory with one host-to-device copy (see
:mod:`ctx_fairseq.modules.sentence_cache`). ``--memory-cache-sentences N``
(default 100000) bounds the number of entries (one per distinct source, plus one per distinct
source-target pair with decoder integration), least recently used out; 0: no
cache (the memory is computed per batch, in chunks). The cache is not a
module or buffer: never saved in a checkpoint, and a ``copy.deepcopy`` of
the model starts with an empty one. It is emptied when weights are loaded
(``load_state_dict``, i.e. a checkpoint restored) or the frozen copies are
(re)made, and whenever the frozen weights are no longer those it was filled
with (moved, cast or changed in place; checked per batch by storage and
version counters). ``set_memory_cache(SentenceStateCache(n, dtype=torch.float16))`` would
store half precision (then cached and uncached memories differ).

With the task's ``--memory-precomputed`` (which requires ``--context-memory
frozen``; checked in :meth:`TransformerSelectiveDocModel.build_model`),
batches count only their own sentences in ``--max-tokens``: what is encoded
with gradients stays bounded by it, and cache misses add forward-only work
(no activations kept), in chunks, once per sentence while it stays cached
(the context layer's trainable projection of the assembled memory stays
linear in the visible document). ``--context-memory frozen`` without
``--memory-precomputed`` still counts the memory in the batch, as a shared
memory is counted.

What does not fit: the batch must hold what its sentences can see (the
task's batching counts the memory in ``--max-tokens`` and cuts documents
into chunks that carry the memory they need); a sentence whose visible
document alone exceeds ``--max-tokens`` is an error there (not with
``--memory-precomputed``, where the memory is not counted).

Choices where the paper is silent:

* Decoder-integration queries ``Q_s``, ``Q_w`` are the last decoder layer's
  source-attention output (Sec. 3.3, Fig. 3); ``r`` (Eq. 7-8) is the decoder
  stack output; the memory's word ``t`` is the state at the input position
  of target word ``t`` (teacher forcing, the ``</s>`` that starts decoding
  is not a word).
* A sentence with no visible context is translated exactly as by the
  sentence-level part (``d = 0``, ``r~ = r``; see the module).
* Incremental decoding: the decoder memory is computed at the first step of
  a batch and kept in the incremental state; beam reordering touches only
  ``query_doc``/``query_pos`` (in ``encoder_out``), never the memory.
* Two-stage training: ``--init-from-sentence-checkpoint`` (stage 1: a
  ``transformer``); ``--freeze-sentence-level`` trains only the context layer.
* An empty memory (online, a batch of first sentences only: ``--batch-size
  1``, fairseq-interactive on a document's first line) runs nothing for the
  memory; every sentence of such a batch is translated by the sentence-level
  part.
* The frozen copies get fresh fairseq incremental-state ids (``deepcopy``
  would copy the decoder's, and beam search, which reorders the incremental
  state of every submodule, would then reorder the decoder's buffers twice).
* Decoder integration reads the last decoder layer's source attention as a
  side output, so with ``--checkpoint-activations`` that one layer is not
  checkpointed (a checkpointed layer computes it without gradients);
  ``--decoder-layerdrop`` (which may skip that layer) and a
  ``--decoder-output-dim`` other than ``--decoder-embed-dim`` are errors.
* ``--doc-sentence-distance N`` (beyond the paper, default 0 = off): a
  learned per-head bias on the sentence-level scores by the signed sentence
  distance clipped to ``[-N, N]`` (recency; see the module docstring).
* ``uses_target_context`` (read by the task) is true for decoder
  integration only; ``context_stats()`` keeps the last forward's info
  detached from the autograd graph.

Training statistics (``--criterion label_smoothed_cross_entropy_ctx``, see
docs/criterion.md; :meth:`TransformerSelectiveDocModel.context_statistics`),
all over the non-padding query tokens (source tokens with encoder
integration, decoder input positions with decoder integration) of the
sentences that have visible context: ``gate`` (mean ``gamma`` of Eq. 7, the
share of the sentence-level representation ``r`` in Eq. 8), ``ctx_mass``
(``1 - gamma``, the share of the document context ``d``), ``ctx_frac`` (the
share of non-padding query tokens whose sentence has visible context),
``sent_support`` / ``sent_visible`` (non-zero sentence weights of Eq. 3 /
visible sentences, per query token and head), ``word_support`` (non-zero
word weights of Eq. 4 per selected (token, head, sentence); not with
``flat-sentence``).
"""

# The package by role, as fairseq's transformer: ``common`` (batch keys and
# helpers), ``encoder``, ``decoder``, ``model`` (registration, options,
# architectures). Importing the package registers the model; every name is
# imported from the module that defines it.
from ctx_fairseq.models.transformer_selective_doc import model  # noqa: F401  (registers the model)

