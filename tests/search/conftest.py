import pytest

# Plain asserts in the shared contract suite report their operands like test-module asserts.
pytest.register_assert_rewrite("procedure_contract")
