"""GPU telemetry: every GPU task's profile (sampled by the runtime), its advice and cost, XCom, OpenLineage, the UI."""

XCOM_KEY = "gpu_profile"  # the XCom key of a task try's profile (the return value keeps ``return_value``)
#: Every try's profile in the task instance's task state store: the prefix, then the try number (``report.try_key``)
TRY_KEY_PREFIX = "airflow_gpu_provider.gpu_profile.try_"
