"""`whet`: the operator and developer command line, an application over the services."""
