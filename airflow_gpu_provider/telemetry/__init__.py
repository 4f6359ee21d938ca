"""GPU telemetry: every GPU task's profile (sampled by the runtime), its advice and cost, XCom, OpenLineage, the UI."""

XCOM_KEY = "gpu_profile"  # the XCom key of a task try's profile (the return value keeps ``return_value``)
