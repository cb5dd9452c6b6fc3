"""The Tinker HTTP API as FastAPI routers; Ray Serve wiring lives in deployments/."""
