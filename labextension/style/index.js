import './view.css';
import './base.css';
