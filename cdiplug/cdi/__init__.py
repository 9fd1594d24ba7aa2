"""Container Device Interface: the spec model, names, versions, the writer and validation."""
