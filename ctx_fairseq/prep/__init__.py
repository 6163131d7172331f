"""Corpus preparation: turning released corpora (XML, SGM, TED tags, OPUS,
TVsub) into the parallel text and ``.docids`` files the document task reads.
Above the runtime data (``ctx_fairseq.data``, which never imports this
package): ``docs`` (``ctx-prep-docs``), ``corpora`` (``ctx-prep-corpora``),
``tvsub`` (the TVsub recipe's preparation and scoring)."""
