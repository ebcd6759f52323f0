"""Making a saved checkpoint load the same outside ropescale.

:mod:`.legacy` adds the config.json keys older transformers (4.x) and the serving engines read
(``rope_scaling``, top-level ``rope_theta``...) beside transformers 5's ``rope_parameters``;
:mod:`.engines` says, from a config.json alone, which engines keep the scaling, which lose it, and why.
"""
