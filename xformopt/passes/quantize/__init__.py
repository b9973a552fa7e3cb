"""The INT8 quantize pass: ``run`` (options, dynamic/static, the record), ``formats`` (the target's INT8
formats ladder), ``calibration`` (calibration rows and ranges, per-GEMM harm), ``outliers`` (the family's
outlier rules) and ``budget`` (the accuracy budget: harmful GEMMs back to float)."""
