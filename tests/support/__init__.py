"""Helpers of the tests: task modules the workers import, fixtures' machinery, checks shared by several test modules."""
