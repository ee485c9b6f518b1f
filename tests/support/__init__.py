"""Test-only support code (never packaged: tests/ is not in the wheel)."""
