"""The engine: roles, frozen weights, client work, the round builder, server steps, the one
composer, schedules and the processes (docs/engine.md). Its modules load on import of each."""
