"""Topic declarations (``topics/*.yaml``) and the planner that applies them to a broker."""
