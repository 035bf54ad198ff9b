"""Fine-tuning tasks: data readers, feature builders, metrics, SQuAD, the task kinds and the fine-tuning driver.

Kept import-free on purpose (importing ``bertforge.tasks`` must not pull in torch, sklearn or seqeval);
import the submodules you need:

* ``bertforge.tasks.readers``: every reader in one namespace (``TextExample`` / ``TaggingExample`` /
  ``ChoiceExample``; GLUE readers, ``read_table``, ``read_conll``, ``read_swag``; the ``TASKS`` registry and
  ``get_task(name)``), living in ``examples``, ``glue``, ``table``, ``conll``, ``swag`` and ``registry``.
  Standard library only (the optional data libraries when a source needs them).
* ``bertforge.tasks.features``: ``encode_text_examples``, ``encode_tagging_examples`` /
  ``tags_from_token_predictions``, ``encode_choice_examples`` (torch tensors).
* ``bertforge.tasks.metrics``: ``compute_metrics(task, predictions, labels)``, ``ner_metrics``,
  ``squad_v1_metrics``, ``squad_v2_metrics`` and the metric functions they use.
* ``bertforge.tasks.squad``: ``read_squad``, ``split_by_article``, ``build_squad_features``,
  ``postprocess``, ``best_threshold`` / ``apply_threshold``, ``references``.
* ``bertforge.tasks.config``: ``FinetuneConfig`` and the task names (standard library only).
* ``bertforge.tasks.kinds``: one class per task kind (read, check, encode, evaluate, predict, build).
* ``bertforge.tasks.finetune`` / ``predict`` / ``folders``: the driver, predictions, fine-tuned model folders.
"""
