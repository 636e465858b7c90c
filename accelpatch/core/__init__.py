"""The thin core every feature builds on: ``apply``/``remove`` (:mod:`.patcher`), the site and class swap
(:mod:`.sites`, :mod:`.gate`), the call context and tiers (:mod:`.call_context`, :mod:`.tiers`, :mod:`.steps`), one
counter type and the report (:mod:`.reporting`), the errors, what a model adapter provides (:mod:`.adapter`), and the
registry of the features and families it hosts (:mod:`.features`, :mod:`.backends`). It imports no feature, no model
and no kernel: they register themselves (``tests/test_import_layers.py`` checks it)."""
