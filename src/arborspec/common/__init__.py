"""Small helpers shared by every layer; they import nothing of arborspec but `errors`."""
