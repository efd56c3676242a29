"""From a compute to a callable: ``auto_schedule`` (:mod:`~dsl.runtime.schedule`), ``build``
into ``kernel_meta/`` (:mod:`~dsl.runtime.build`), ``load`` (:mod:`~dsl.runtime.kernel`), the
per-signature kernel cache of the numpy APIs (:mod:`~dsl.runtime.kernel_cache`) and atomic
file publishing (:mod:`~dsl.runtime.atomic`)."""
