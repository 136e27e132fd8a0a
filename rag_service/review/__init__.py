"""Review-queue policy (pure): the tiered gate, reasons, priority, and judge-human agreement."""
