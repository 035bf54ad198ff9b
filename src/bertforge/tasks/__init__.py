"""Fine-tuning tasks: data readers, feature builders, metrics, SQuAD (and, on top, the task models).

Kept import-free on purpose (importing ``bertforge.tasks`` must not pull in torch, sklearn or seqeval);
import the submodules you need:

* ``bertforge.tasks.readers``: ``TextExample`` / ``TaggingExample`` / ``ChoiceExample``; GLUE readers
  (``read_sst2``, ``read_cola``, ``read_mrpc``, ``read_stsb``, ``read_rte``, ``read_qnli``, ``read_nli_jsonl``),
  ``read_table`` (any CSV / TSV / JSONL with a column mapping), ``read_conll``, ``read_swag``; the ``TASKS``
  registry and ``get_task(name)``. Standard library only.
* ``bertforge.tasks.features``: ``encode_text_examples``, ``encode_tagging_examples`` /
  ``tags_from_token_predictions``, ``encode_choice_examples`` (torch tensors).
* ``bertforge.tasks.metrics``: ``compute_metrics(task, predictions, labels)``, ``ner_metrics``,
  ``squad_v1_metrics``, ``squad_v2_metrics`` and the metric functions they use.
* ``bertforge.tasks.squad``: ``read_squad``, ``split_by_article``, ``build_squad_features``,
  ``postprocess``, ``best_threshold`` / ``apply_threshold``, ``references``.
"""
