"""The reviewer console: later issues."""
