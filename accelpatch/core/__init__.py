"""The thin core every feature builds on: ``apply``/``remove`` (:mod:`.patcher`), the site and class swap
(:mod:`.sites`, :mod:`.gate`), the call context and tiers (:mod:`.call_context`, :mod:`.tiers`, :mod:`.steps`), one
counter type and the report (:mod:`.reporting`), the errors, and what a model adapter provides (:mod:`.adapter`).
It knows no model and no kernel."""
