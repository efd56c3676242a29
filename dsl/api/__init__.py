"""numpy-level entry points of the vendor libraries: ``dsl.aclnn`` (aclnn two-phase operators
as build-once, run-many calls) and ``dsl.deconvgradfilter`` (the DSP library's param[] API)."""
