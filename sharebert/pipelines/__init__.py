"""``sharebert compress``: the embedding path's flow (``compress``) and the classifier path's
(``compress_classifier``, its report ``classifier_report``), and the parts both share, one module each: ``plan``
(the checks before any model loads, the student, ``--max-time``), ``out_folder`` (``--out``: marker, resume,
overwrite), ``teacher_pass`` (the teacher's artifact and vectors, cached), ``quality`` (the embedding measures and the
verdict), ``report`` (figures and files), ``report_rows`` (what its table and picture show) and ``picture``
(``report.png``)."""
