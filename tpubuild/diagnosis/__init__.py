"""`tpubuild explain-error`: where a bfloat16 or int8 artifact's error comes from, op by op
(`node_errors`), and the recipe change that brings it within verify's tolerance, measured
by running the lossy stage's own code again with it (`explain_error`). Above stages/, whose
code it reruns; below the commands."""
