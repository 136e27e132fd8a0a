"""The reviewer console: server-rendered pages at /review."""
