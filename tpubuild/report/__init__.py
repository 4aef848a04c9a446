"""The conversion report: compute cost, parameters, TensorFlow compatibility, formats,
and the serving targets side by side. TensorFlow-free except where a module says so."""
